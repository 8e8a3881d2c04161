"""The service's wire: models, errors, retry policy and the HTTP client. Nothing here knows Prefect."""

"""The Prefect flows: `generate_from_manifest` (a batch) and `export_deliverables` (a delivery)."""

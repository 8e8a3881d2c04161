"""Units of work: reading and checking manifests, making one request, writing the output folder.

Plain functions first; Prefect tasks wrap them thinly. Nothing here decides order or concurrency.
"""

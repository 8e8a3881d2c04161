"""One unit of work and its records: build a request, send it, journal it, keep its files and usage."""

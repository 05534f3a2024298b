"""Prometheus metrics (text exposition at /metrics) and the console's per-season samples,
shared by every process through Redis.

counters.py: the counters writers increment (Redis only: ingest's listener pulls in nothing
else); render.py: the /metrics scrape, with gauges read from the rank views and the
database; samples.py: the console's per-season samples (Celery beat).
"""

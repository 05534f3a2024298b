"""Django's PostgreSQL backend with a connection pool that does not wait for a connection
the server refuses (config/postgresql/base.py); the settings use it whenever the pool is on."""

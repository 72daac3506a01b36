"""The routes, one router per area (FastAPI's "bigger applications" layout); server/app.py
includes each with one line."""

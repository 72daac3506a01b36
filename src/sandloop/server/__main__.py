"""``python -m sandloop.server serve ...`` / ``add-key ...``: the same commands as ``sandloop``."""

from sandloop.cli.main import app

if __name__ == "__main__":
    app()

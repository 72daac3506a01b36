"""``python -m sandloop ...``: the same commands as the ``sandloop`` script."""

from sandloop.cli.main import app

if __name__ == "__main__":
    app(prog_name="sandloop")

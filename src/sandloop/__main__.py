"""``python -m sandloop ...``: the same commands, exit codes and error lines as the script."""

from sandloop.cli.main import script

if __name__ == "__main__":
    script()

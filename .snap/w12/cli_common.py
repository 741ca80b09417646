"""What every `w12` command shares: exit codes, the error-to-exit mapping, byte formatting."""

import sys

import click

from w12.formats.errors import W12Error

EXIT_OK, EXIT_MISMATCH, EXIT_UNUSABLE = 0, 1, 2


def run(fn, *args, on_interrupt: str = "interrupted", **kwargs):
    """Call a library function; any W12Error becomes `error: …` on stderr and exit code 2."""
    try:
        return fn(*args, **kwargs)
    except W12Error as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_UNUSABLE)
    except KeyboardInterrupt:
        click.echo(on_interrupt, err=True)
        sys.exit(130)


def human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000

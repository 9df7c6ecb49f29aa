"""``hpcdist report JOB``: a sweep's points (or one job) compared in one table."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hpcdist.errors import UserError


@click.command(name="report")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per point, best first.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also draw every point's validation loss on one log-scale chart (a PNG).",
)
def report(job_id: str, as_json: bool, plot_path: Path | None) -> int:
    """Compare the trainings of a job or a sweep: overrides, state, best validation loss,
    R^2, epochs and wall time, sorted by validation loss, the best marked."""
    from hpcdist.jobs import report as reporting

    if plot_path is not None and not plot_path.parent.is_dir():
        raise UserError(
            f"--plot {str(plot_path)!r}: folder {str(plot_path.parent)!r} does not exist"
        )
    rows = reporting.collect(job_id)
    if as_json:
        click.echo(json.dumps([row.to_json() for row in rows], indent=2))
    else:
        click.echo(reporting.table(rows), nl=False)
    if plot_path is not None:
        try:
            reporting.plot(rows, plot_path)
        except OSError as exc:
            raise UserError(f"--plot {str(plot_path)!r} cannot be written: {exc.strerror}") from exc
        click.echo(f"wrote {plot_path}", err=True)
    return 0

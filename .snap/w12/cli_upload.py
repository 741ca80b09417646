"""`w12 upload`: publish a verified W12 checkpoint on the Hugging Face Hub with a generated model card.

Registered in w12/cli.py with `main.add_command(upload)`; a thin shell over w12.convert.hub.
"""

import json
import sys

import click

from w12.cli_common import EXIT_OK, human, run


@click.command()
@click.argument("w12dir", type=click.Path())
@click.argument("repo_id")
@click.option("--private", is_flag=True, default=None, help="Create the repo as private (an existing repo keeps "
              "its visibility).")
@click.option("--revision", metavar="R", help="Branch to upload to (created if missing). Default: main.")
@click.option("--commit-message", metavar="M", help="Commit message. Default: 'Upload W12 checkpoint (...)'.")
@click.option("--base-model", metavar="ID", help="Hub id of the BF16 model this was converted from, for the card. "
              "Default: the Hub id `w12 convert` fetched, else config.json's _name_or_path if it is a Hub id.")
@click.option("--token", metavar="TOKEN", help="Hugging Face token with write access. Default: HF_TOKEN, "
              "else the saved login (`hf auth login`). Never printed or stored.")
@click.option("--endpoint", metavar="URL", help="Hub URL. Default: HF_ENDPOINT, else https://huggingface.co.")
@click.option("--dry-run", is_flag=True, help="Print the files and the model card that would be uploaded; send "
              "nothing (and do not verify).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (with --dry-run) or the result as JSON.")
def upload(w12dir, repo_id, private, revision, commit_message, base_model, token, endpoint, dry_run, as_json):
    """Upload the W12 checkpoint W12DIR to the Hugging Face Hub repo REPO_ID.

    \b
    1. checks REPO_ID and finds a token (no request before that);
    2. runs `w12 verify` on W12DIR: a folder it rejects is not uploaded;
    3. creates the repo if needed and uploads every file (resumable: re-run after an interruption).

    The repo's README.md is a generated model card (base model, sizes, bits per weight, escape rate,
    how to load it, verification hash) unless W12DIR has its own README.md, which is then uploaded as
    it is. The card is never written into W12DIR. w12_convert.json (local conversion state) is not
    uploaded. Exit status: 0 uploaded, 2 not uploaded (bad repo id, unverified folder, no network, ...).
    """
    from w12.convert import hub

    if dry_run:
        plan = run(hub.plan_upload, w12dir, repo_id, base_model=base_model, revision=revision, private=private,
                   commit_message=commit_message)
        if as_json:
            click.echo(json.dumps({"dry_run": True, **plan.to_dict(), "card_text": plan.card_text}, indent=1))
            return
        for f in plan.files:
            note = "  (generated model card)" if f.path == hub.CARD and plan.card == "generated" else ""
            click.echo(f"{f.path:60} {human(f.size):>10}{note}")
        for rel in plan.ignored:
            click.echo(f"{rel:60} {'skipped':>10}")
        click.echo(f"would upload {len(plan.files)} files ({human(plan.total_bytes)}) to {plan.repo_id}"
                   + (f" (revision {revision})" if revision else "") + "; nothing sent")
        if plan.card_text is not None:
            click.echo("\n" + plan.card_text)
        return

    def say(line):
        click.echo(line, err=True)

    def do_upload():
        try:
            return hub.upload(w12dir, repo_id, token=token, private=private, revision=revision,
                              commit_message=commit_message, base_model=base_model, endpoint=endpoint,
                              progress=not as_json, echo=None if as_json else say)
        except KeyboardInterrupt:  # before `run`, whose message is worded for `convert`
            click.echo("interrupted; re-run the same command to resume (files already on the Hub are skipped)",
                       err=True)
            sys.exit(130)

    result = run(do_upload)
    if as_json:
        click.echo(json.dumps({"repo_url": result.repo_url, "commit_url": result.commit_url,
                               "commit_oid": result.commit_oid, **result.plan.to_dict()}, indent=1))
    else:
        click.echo(f"uploaded {len(result.plan.files)} files to {result.repo_url}"
                   + (f"\ncommit: {result.commit_url}" if result.commit_url else ""))
    sys.exit(EXIT_OK)

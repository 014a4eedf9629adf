"""The `personaemp` command line: one thin function per stage."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from personaemp.config import Resolver
from personaemp.errors import PersonaempError
from personaemp.options import CLI_ONLY, COMMANDS, LLM_PANEL, OptionSpec, show_default, specs

app = typer.Typer(
    help="Build personalized-empathy datasets (PersonaEmp) from long-term user-AI interaction data.",
    no_args_is_help=True,
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    """Staged commands: filter -> infer-persona -> gen-queries -> split -> stats -> push; then
    criteria -> respond -> evaluate to benchmark models on the dataset; export to train on it."""
    if version:
        from personaemp import __version__

        typer.echo(__version__)
        raise typer.Exit()


def entry() -> None:
    """The `personaemp` program (console script and `python -m personaemp`): the app, then
    an immediate exit. Python's teardown of what a run imports (scikit-learn, datasets,
    matplotlib...) took 0.6 s after the work was done; everything is written and closed
    by then, so after the atexit handlers and a flush the process just ends."""
    import atexit
    import os
    import sys

    try:
        app(prog_name="personaemp")
        code = 0
    except SystemExit as done:  # how click ends: its code, or a message for stderr
        code = done.code
        if isinstance(code, str):
            sys.stderr.write(code + "\n")
            code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def stderr_console() -> Console:
    return Console(stderr=True, soft_wrap=True)


def reports_errors(command):
    """Turn library errors into one line on stderr and the error's exit code (no traceback)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (PersonaempError, OSError) as error:
            from personaemp.errors import os_error
            from personaemp.secrets import redact

            if isinstance(error, OSError):  # the same line for every command: path, what, what to do
                error = os_error(error)
            stderr_console().print(f"[bold red]Error:[/] {escape(redact(str(error)))}")
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            stderr_console().print("[bold red]Interrupted.[/] Finished outputs were left as they were.")
            raise typer.Exit(130) from None
        except Exception as error:
            if type(error).__module__.split(".")[0] in ("click", "typer"):  # how a command exits
                raise
            _report_bug()
            raise typer.Exit(1) from None

    return wrapper


def _report_bug() -> None:
    """A genuine bug keeps its traceback (redacted), and says that it is one."""
    import traceback

    from personaemp.secrets import redact

    console = stderr_console()
    console.print(escape(redact(traceback.format_exc()) or ""), highlight=False, end="")
    console.print(
        "[bold red]Bug:[/] this is an error in personaemp itself, not in your input or machine: "
        "please report it with the lines above."
    )


# --- stage commands: their options are generated from personaemp.options ----------------------


def _typer_parameter(option: OptionSpec, panel: str | None) -> inspect.Parameter:
    """One option of a model as a Typer parameter. Values reach the model unparsed (as
    text), so a bad flag, env var or TOML value gets the same one-line error."""
    default = option.default
    common = {
        "help": escape(option.help),
        "rich_help_panel": panel,
        "envvar": option.opt.env,  # shown in --help; the value itself is read by the resolver
        "show_envvar": bool(option.opt.env),
    }
    if option.kind == "bool":
        annotation: Any = Annotated[bool, typer.Option(*option.flags, **common)]
        value: Any = default
    else:
        multiple = option.kind in ("list", "dict")
        annotation = Annotated[
            list[str] | None if multiple else str | None,
            typer.Option(*option.flags, metavar=option.metavar, **common),
        ]
        if multiple:
            value = ([str(item) for item in default] or None) if isinstance(default, list) else None
        else:
            value = show_default(default) or None
    return inspect.Parameter(
        option.name, inspect.Parameter.KEYWORD_ONLY, default=value, annotation=annotation
    )


def stage_command(name: str):
    """Register `func(options: Resolver, **cli_only)` as the stage command `name`.

    The command's options are the fields of its sections (personaemp.options.COMMANDS),
    plus --config and the command-only parameters `func` declares itself. Only the
    options given on the command line are passed on: env vars, the config file and the
    defaults are layered under them by the resolver, exactly as `personaemp run` does."""
    sections = COMMANDS[name]

    def register(func):
        own = [
            parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for parameter in list(inspect.signature(func, eval_str=True).parameters.values())[1:]
        ]
        generated = [
            _typer_parameter(option, LLM_PANEL if section == "llm" else None)
            for section in sections
            for option in specs(section)
        ]
        config = inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                Path | None, typer.Option("--config", "-c", help=CLI_ONLY[name]["--config"])
            ],
        )
        context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

        def command(ctx: typer.Context, config: Path | None = None, **values):
            from personaemp.config import cli_flags
            from personaemp.paths import check_command

            flags: dict[str, dict[str, Any]] = {}
            for section in sections:
                given = {}
                for option in specs(section):
                    value = values.pop(option.name)
                    # (compared by name: typer may bundle its own click)
                    source = ctx.get_parameter_source(option.name)
                    if source is not None and source.name == "COMMANDLINE":
                        given[option.name] = value
                flags[section] = cli_flags(section, given)
            resolver = Resolver(config, flags=flags, style="cli")
            check_command(name, resolver.section)
            return func(resolver, **values)

        command.__signature__ = inspect.Signature([context, config, *generated, *own])  # type: ignore[attr-defined]
        command.__name__, command.__doc__ = func.__name__, func.__doc__
        command.__annotations__ = {}
        app.command(name)(reports_errors(command))
        return func

    return register


@stage_command("filter")
def filter_command(
    options: Resolver,
    show_rules: Annotated[
        bool, typer.Option("--show-rules", help=CLI_ONLY["filter"]["--show-rules"])
    ] = False,
) -> None:
    """Keep the users whose memories show personality and emotionally relevant experience."""
    if show_rules:
        from personaemp.rules import default_rules_text

        typer.echo(default_rules_text(), nl=False)
        return
    from personaemp.pipeline import run_filter

    run_filter(options.filter, stderr_console())


@stage_command("infer-persona")
def infer_persona_command(
    options: Resolver,
    show: Annotated[
        str | None, typer.Option("--show", metavar="USER", help=CLI_ONLY["infer-persona"]["--show"])
    ] = None,
) -> None:
    """Infer an evidence-grounded persona and Big Five levels for each filtered user (LLM)."""
    if show is not None:
        from personaemp.summaries import print_persona

        print_persona(options.persona.output, show, Console(soft_wrap=True))
        return
    from personaemp.pipeline import run_persona

    run_persona(options.persona, options.llm, stderr_console())


@stage_command("gen-queries")
def gen_queries_command(options: Resolver) -> None:
    """Write empathy-seeking queries (ES, HEQ, SS) for each eligible persona and check them (LLM)."""
    from personaemp.pipeline import run_queries

    run_queries(options.queries, options.llm, stderr_console())


@app.command("merge")
@reports_errors
def merge_command(
    stage: Annotated[str, typer.Argument(help="The stage run as shards: infer-persona or gen-queries.")],
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="personaemp.toml to read the stage's paths from.")
    ] = None,
    input: Annotated[  # noqa: A002 - the flag's name
        Path | None, typer.Option("--input", "-i", help="The stage's input (default: from the config).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="The stage's output; the shards are beside it (default: config)."
        ),
    ] = None,
) -> None:
    """Join the shard files of an LLM stage (--shard I/N) into its output, checking that
    every user is in exactly one shard."""
    from personaemp.config import load_config
    from personaemp.pipeline import run_merge

    run_merge(stage, load_config(config), stderr_console(), input_path=input, output=output)


@app.command("serve-local")
@reports_errors
def serve_local_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8011,
    n_ctx: Annotated[int, typer.Option(help="Context size in tokens.")] = 8192,
) -> None:
    """Serve the embedded model (OpenAI-compatible, foreground) for other tools; Ctrl-C stops it."""
    from personaemp.llm.local import serve_local

    code = serve_local(host=host, port=port, n_ctx=n_ctx)
    if code:
        raise typer.Exit(code)


@stage_command("split")
def split_command(options: Resolver) -> None:
    """Split users into train/test: random 9:1, and (unless --no-ood) a held-out Big Five cluster."""
    from personaemp.pipeline import run_split

    run_split(options.split, stderr_console())


@stage_command("stats")
def stats_command(options: Resolver) -> None:
    """Describe a build: funnel, Big Five levels, queries, checks, as stats.json, plots and a summary."""
    from personaemp.pipeline import run_stats

    run_stats(options.stats, stderr_console())


@stage_command("push")
def push_command(options: Resolver) -> None:
    """Publish the splits as a Hub dataset (configs random and ood) with a dataset card;
    without --repo-id, or with --dry-run, write the same repository to --out."""
    from personaemp.pipeline import run_push

    run_push(options.push, stderr_console())


@app.command("run")
@reports_errors
def run_command(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="personaemp.toml (default: built-in settings).")
    ] = None,
) -> None:
    """Run filter -> infer-persona -> gen-queries -> split -> stats -> push from one config, resuming."""
    from personaemp.config import load_config
    from personaemp.pipeline import run_pipeline

    options = load_config(config)  # every section now: a bad value stops before any stage
    run_pipeline(options, stderr_console())


@stage_command("criteria")
def criteria_command(options: Resolver) -> None:
    """Write 4-6 weighted evaluation criteria per query and PERM dimension, seeing no response (LLM)."""
    from personaemp.pipeline import run_criteria

    run_criteria(options.criteria, options.llm, stderr_console())


@stage_command("respond")
def respond_command(options: Resolver) -> None:
    """Have a policy model answer every query of a split, with the chosen context (LLM)."""
    from personaemp.pipeline import run_respond

    run_respond(options.respond, options.llm, stderr_console())


@stage_command("export")
def export_command(options: Resolver) -> None:
    """Write a split as training files: TRL's conversational prompts (JSON lines) or verl's parquet,
    with the prompts `respond` sends and what the PereGRM reward reads."""
    from personaemp.pipeline import run_export

    run_export(options.section("export"), stderr_console())


@stage_command("evaluate")
def evaluate_command(options: Resolver) -> None:
    """Score systems' responses per PERM dimension (fixed criteria, or dynamic @k), side by side (LLM)."""
    from personaemp.pipeline import run_evaluate

    run_evaluate(options.evaluate, options.llm, Console(soft_wrap=True))


@stage_command("table")
def table_command(options: Resolver) -> None:
    """Render the paper's Table 1 (systems x judge x split: Res, Exp, Rec, Avg) from evaluate reports."""
    from personaemp.pipeline import run_table

    run_table(options.section("table"), stderr_console())


@stage_command("review")
def review_command(
    options: Resolver,
    export_label_studio: Annotated[
        Path | None,
        typer.Option(
            "--export-label-studio", metavar="DIR", help=CLI_ONLY["review"]["--export-label-studio"]
        ),
    ] = None,
    import_label_studio: Annotated[
        Path | None,
        typer.Option(
            "--import-label-studio", metavar="FILE", help=CLI_ONLY["review"]["--import-label-studio"]
        ),
    ] = None,
) -> None:
    """Serve a local page to label a stratified sample of queries: accept/reject, agree with the
    judge or not, traits supported or not, a note; every click goes to the labels file."""
    from personaemp.stages.review import exchange_label_studio, serve_review

    review = options.section("review")
    if export_label_studio or import_label_studio:
        exchange_label_studio(review, export_label_studio, import_label_studio, stderr_console())
        return
    serve_review(review, stderr_console())


@stage_command("agreement")
def agreement_command(options: Resolver) -> None:
    """How far the LLM judge agrees with people (kappa, intervals, precision, corrected pass
    shares) and, with --judge-model, with a second judge re-running the check step."""
    from personaemp.stages.agreement import run_agreement

    run_agreement(options.section("agreement"), options.llm, stderr_console())

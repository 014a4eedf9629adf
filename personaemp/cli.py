"""The `personaemp` command line: one thin function per stage."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from personaemp.errors import PersonaempError

app = typer.Typer(
    help="Build personalized-empathy datasets (PersonaEmp) from long-term user-AI interaction data.",
    no_args_is_help=True,
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

PROCESSED = Path("data/processed")
LLM_PANEL = "LLM endpoint and engine"

# Options shared by every LLM stage. The API key is read from OPENAI_API_KEY only: a flag
# would put it in shell history and process listings.
BaseUrls = Annotated[
    list[str] | None,
    typer.Option(
        "--base-url",
        envvar="OPENAI_BASE_URL",
        help="OpenAI-compatible endpoint; repeat (or comma-separate) to spread requests over several.",
        rich_help_panel=LLM_PANEL,
    ),
]
Model = Annotated[
    str | None, typer.Option(envvar="PERSONAEMP_MODEL", help="Model name.", rich_help_panel=LLM_PANEL)
]
Llm = Annotated[
    str,
    typer.Option(
        help="auto: the embedded local model unless an endpoint is set; local; remote.",
        rich_help_panel=LLM_PANEL,
    ),
]
Structured = Annotated[
    str,
    typer.Option(
        help="Structured output: auto|json_schema|json_object_schema|json_object|none.",
        rich_help_panel=LLM_PANEL,
    ),
]
Concurrency = Annotated[
    int,
    typer.Option(
        envvar="PERSONAEMP_CONCURRENCY", help="Requests in flight per endpoint.", rich_help_panel=LLM_PANEL
    ),
]
Rpm = Annotated[
    float | None, typer.Option(help="Requests per minute per endpoint.", rich_help_panel=LLM_PANEL)
]
Timeout = Annotated[float, typer.Option(help="Seconds per request.", rich_help_panel=LLM_PANEL)]
MaxTokens = Annotated[int, typer.Option(help="max_tokens per request.", rich_help_panel=LLM_PANEL)]
Temperature = Annotated[float, typer.Option(rich_help_panel=LLM_PANEL)]
Retries = Annotated[int, typer.Option(help="Network/HTTP retries per request.", rich_help_panel=LLM_PANEL)]
Reasks = Annotated[
    int, typer.Option(help="Re-asks after an invalid or cut-off reply.", rich_help_panel=LLM_PANEL)
]
WorkDir = Annotated[
    Path,
    typer.Option(
        envvar="PERSONAEMP_WORK_DIR", help="Cache and run report folder.", rich_help_panel=LLM_PANEL
    ),
]
NoCache = Annotated[
    bool, typer.Option("--no-cache", help="Neither read nor write the cache.", rich_help_panel=LLM_PANEL)
]
Refresh = Annotated[
    bool,
    typer.Option("--refresh", help="Ignore cached replies and overwrite them.", rich_help_panel=LLM_PANEL),
]
RetryFailed = Annotated[
    bool,
    typer.Option(
        "--retry-failed", help="Retry only the units of the failures file.", rich_help_panel=LLM_PANEL
    ),
]
PriceIn = Annotated[
    float | None, typer.Option(help="Price per million prompt tokens.", rich_help_panel=LLM_PANEL)
]
PriceOut = Annotated[
    float | None, typer.Option(help="Price per million completion tokens.", rich_help_panel=LLM_PANEL)
]


LLM_OPTIONS = (
    "base_url", "model", "llm", "structured", "concurrency", "rpm", "timeout", "max_tokens",
    "temperature", "max_retries", "max_reasks", "work_dir", "no_cache", "refresh", "price_in", "price_out",
)  # fmt: skip


def llm_settings(values: dict):
    """LLMSettings from a command's shared options; the key comes from the environment only."""
    import os

    from personaemp.llm.settings import LLMSettings

    options = {name: values[name] for name in LLM_OPTIONS}
    urls = [u.strip() for value in options.pop("base_url") or [] for u in value.split(",") if u.strip()]
    return LLMSettings(
        base_urls=urls,
        api_key=os.environ.get("OPENAI_API_KEY"),
        use_cache=not options.pop("no_cache"),
        **options,
    )


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    """Staged commands: filter -> infer-persona -> gen-queries -> split -> push."""
    if version:
        from personaemp import __version__

        typer.echo(__version__)
        raise typer.Exit()


def stderr_console() -> Console:
    return Console(stderr=True, soft_wrap=True)


def reports_errors(command):
    """Turn library errors into one line on stderr and the error's exit code (no traceback)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except PersonaempError as error:
            stderr_console().print(f"[bold red]Error:[/] {escape(str(error))}")
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            stderr_console().print("[bold red]Interrupted.[/] Finished outputs were left as they were.")
            raise typer.Exit(130) from None

    return wrapper


@app.command("filter")
@reports_errors
def filter_command(
    input: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="AlpsBench task1 folder, benchmark_data/ root, raw export file or folder, or hf:OWNER/NAME.",
            envvar="PERSONAEMP_INPUT",
        ),
    ] = "data/raw/alpsbench_sample/task1",
    format: Annotated[str, typer.Option(help="auto|task1|raw|hf.")] = "auto",
    rules: Annotated[
        Path | None, typer.Option(help="Rules TOML overriding the defaults (see --show-rules).")
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o")] = PROCESSED / "filtered.jsonl",
    split: Annotated[
        str | None, typer.Option(help="Split of a benchmark_data/ root or a Hub dataset.")
    ] = None,
    hf_config: Annotated[str | None, typer.Option(help="Config name of a Hub dataset.")] = None,
    on_error: Annotated[
        str, typer.Option(help="fail: stop at the first bad row; skip: skip and count bad rows.")
    ] = "fail",
    turns: Annotated[
        str, typer.Option(help="user: keep the user's own turns; all: keep assistant turns too.")
    ] = "user",
    show_rules: Annotated[
        bool, typer.Option("--show-rules", help="Print the default rules file and exit.")
    ] = False,
) -> None:
    """Keep the users whose memories show personality and emotionally relevant experience."""
    if show_rules:
        from personaemp.rules import default_rules_text

        typer.echo(default_rules_text(), nl=False)
        return
    from personaemp.stages.filter import filter_users
    from personaemp.summaries import print_filter_summary

    console = stderr_console()
    report = filter_users(
        input,
        output,
        fmt=format,
        rules_path=rules,
        split=split,
        hf_config=hf_config,
        on_error=on_error,
        keep_turns=turns,
        report_path=output.with_name("filter_report.json"),
        console=console,
    )
    print_filter_summary(report, console)


@app.command("infer-persona")
@reports_errors
def infer_persona_command(
    input: Annotated[Path, typer.Option("--input", "-i")] = PROCESSED / "filtered.jsonl",
    output: Annotated[Path, typer.Option("--output", "-o")] = PROCESSED / "personas.jsonl",
    limit: Annotated[int | None, typer.Option(help="Only the first N users.")] = None,
    users: Annotated[list[str] | None, typer.Option("--users", help="Only these user ids (repeat).")] = None,
    require_depth: Annotated[
        bool,
        typer.Option(help="Drop users the depth check turns away (--no-require-depth keeps grounded ones)."),
    ] = True,
    show: Annotated[
        str | None, typer.Option("--show", help="Print this user's persona next to its evidence and exit.")
    ] = None,
    base_url: BaseUrls = None,
    model: Model = None,
    llm: Llm = "auto",
    structured: Structured = "auto",
    concurrency: Concurrency = 16,
    rpm: Rpm = None,
    timeout: Timeout = 120.0,
    max_tokens: MaxTokens = 1024,
    temperature: Temperature = 0.7,
    max_retries: Retries = 6,
    max_reasks: Reasks = 2,
    work_dir: WorkDir = PROCESSED / ".personaemp",
    no_cache: NoCache = False,
    refresh: Refresh = False,
    retry_failed: RetryFailed = False,
    price_in: PriceIn = None,
    price_out: PriceOut = None,
) -> None:
    """Infer an evidence-grounded persona and Big Five levels for each filtered user (LLM)."""
    console = stderr_console()
    if show is not None:
        from personaemp.summaries import print_persona

        print_persona(output, show, Console(soft_wrap=True))
        return
    from personaemp.stages.persona import infer_personas
    from personaemp.summaries import print_persona_summary, print_stage_report

    settings = llm_settings(locals())
    report, summary = infer_personas(
        input,
        output,
        settings,
        limit=limit,
        users=users,
        retry_failed=retry_failed,
        require_depth=require_depth,
        console=console,
    )
    print_stage_report(report, console)
    print_persona_summary(summary, console)


@app.command("gen-queries")
@reports_errors
def gen_queries_command(
    input: Annotated[Path, typer.Option("--input", "-i")] = PROCESSED / "personas.jsonl",
    output: Annotated[Path, typer.Option("--output", "-o")] = PROCESSED / "queries.jsonl",
    per_category: Annotated[int, typer.Option(help="Situations (so queries) per category per user.")] = 1,
    categories: Annotated[str, typer.Option(help="Comma-separated subset of ES,HEQ,SS.")] = "ES,HEQ,SS",
    enforce: Annotated[
        str | None, typer.Option(help="Checks a query must pass, comma-separated (default: all).")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N eligible users.")] = None,
    users: Annotated[list[str] | None, typer.Option("--users", help="Only these user ids (repeat).")] = None,
    base_url: BaseUrls = None,
    model: Model = None,
    llm: Llm = "auto",
    structured: Structured = "auto",
    concurrency: Concurrency = 16,
    rpm: Rpm = None,
    timeout: Timeout = 120.0,
    max_tokens: MaxTokens = 1024,
    temperature: Temperature = 0.7,
    max_retries: Retries = 6,
    max_reasks: Reasks = 2,
    work_dir: WorkDir = PROCESSED / ".personaemp",
    no_cache: NoCache = False,
    refresh: Refresh = False,
    retry_failed: RetryFailed = False,
    price_in: PriceIn = None,
    price_out: PriceOut = None,
) -> None:
    """Write empathy-seeking queries (ES, HEQ, SS) for each eligible persona and check them (LLM)."""
    from personaemp.stages.queries import QueryOptions, generate_queries
    from personaemp.summaries import print_query_funnel, print_stage_report

    console = stderr_console()
    settings = llm_settings(locals())
    options = QueryOptions(
        categories=tuple(c.strip().upper() for c in categories.split(",") if c.strip()),
        per_category=per_category,
        **({"enforce": tuple(c.strip() for c in enforce.split(",") if c.strip())} if enforce else {}),
    )
    report, funnel = generate_queries(
        input,
        output,
        settings,
        options=options,
        limit=limit,
        users=users,
        retry_failed=retry_failed,
        console=console,
    )
    print_stage_report(report, console)
    print_query_funnel(funnel, console)


@app.command("serve-local")
@reports_errors
def serve_local_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8011,
    n_ctx: Annotated[int, typer.Option(help="Context size in tokens.")] = 8192,
) -> None:
    """Serve the embedded model (OpenAI-compatible, foreground) for other tools."""
    from personaemp.llm.local import serve_local

    serve_local(host=host, port=port, n_ctx=n_ctx)


@app.command("split")
@reports_errors
def split_command(
    input: Annotated[Path, typer.Option("--input", "-i")] = PROCESSED / "queries.jsonl",
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o")] = PROCESSED / "splits",
    ood: Annotated[
        bool, typer.Option("--ood", help="Also the OOD split: one Big Five cluster held out.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of the shuffle and of KModes.")] = 13,
    test_size: Annotated[float, typer.Option(help="Share of users in test (OOD: the target size).")] = 0.1,
    k: Annotated[
        int | None, typer.Option("--k", help="Clusters; default: the elbow over --k-min..--k-max.")
    ] = None,
    k_min: Annotated[int, typer.Option(help="Smallest k of the elbow sweep.")] = 2,
    k_max: Annotated[int, typer.Option(help="Largest k of the elbow sweep.")] = 8,
    holdout: Annotated[
        int | None, typer.Option(help="Cluster id to hold out; default: size closest to --test-size.")
    ] = None,
    seeds: Annotated[int, typer.Option(help="KModes runs per k (the lowest cost is kept).")] = 5,
) -> None:
    """Split users into train/test: random 9:1, and with --ood a held-out Big Five cluster."""
    from personaemp.stages.split import split_users
    from personaemp.summaries import print_split_report

    report = split_users(
        input,
        out_dir,
        ood=ood,
        seed=seed,
        test_size=test_size,
        k=k,
        k_range=(k_min, k_max),
        holdout=holdout,
        seeds=seeds,
    )
    print_split_report(report, out_dir, stderr_console())


@app.command("push")
@reports_errors
def push_command(
    splits: Annotated[
        Path, typer.Option("--splits", help="Folder written by `personaemp split`.")
    ] = PROCESSED / "splits",
    repo_id: Annotated[str | None, typer.Option("--repo-id", help="Hub dataset repo OWNER/NAME.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Write the repository to --out instead.")
    ] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for --dry-run.")] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the repo private.")] = False,
    revision: Annotated[str | None, typer.Option(help="Branch to push to.")] = None,
    include_dialogue: Annotated[
        bool, typer.Option("--include-dialogue", help="Also publish the users' own messages.")
    ] = False,
) -> None:
    """Publish the splits as a Hub dataset (configs random and ood) with a dataset card."""
    from personaemp.errors import InputError
    from personaemp.stages.publish import publish

    if dry_run and out is None:
        raise InputError("--dry-run needs --out DIR")
    if dry_run and repo_id:
        raise InputError("give --repo-id or --dry-run, not both")
    result = publish(
        splits,
        repo_id=None if dry_run else repo_id,
        out=out if dry_run else None,
        private=private,
        revision=revision,
        include_dialogue=include_dialogue,
    )
    console = stderr_console()
    for setting, parts in result.rows.items():
        console.print(f"[bold]{setting}[/]: " + ", ".join(f"{split} {n} rows" for split, n in parts.items()))
    console.print(f"wrote {result.target}")


@app.command("run")
@reports_errors
def run_command(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="personaemp.toml (default: built-in settings).")
    ] = None,
) -> None:
    """Run filter -> infer-persona -> gen-queries -> split -> push from one config, resuming."""
    from personaemp.config import load_config
    from personaemp.pipeline import run_pipeline

    run_pipeline(load_config(config), stderr_console())

"""The `personaemp` command line: one thin function per stage."""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from personaemp.config import Resolver
from personaemp.errors import PersonaempError
from personaemp.options import (
    CLI_ONLY,
    COMMANDS,
    LLM_PANEL,
    OUTPUT_OPTIONS,
    OptionSpec,
    notice_renamed,
    show_default,
    specs,
)
from personaemp.registry import STAGES
from personaemp.results import stop_if_failed


def _clean_help(params: list) -> list:
    """No type placeholder after a flag (typer shows `<bool>` for --ood/--no-ood, --help...)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif param.param_type_name == "argument" and param.metavar:  # its name says it: no <str>
            param.display_type_rich = lambda ctx: None
    return params


class _Group(TyperGroup):
    def get_params(self, ctx):
        return _clean_help(super().get_params(ctx))


class _Command(TyperCommand):
    def get_params(self, ctx):
        return _clean_help(super().get_params(ctx))

    def make_parser(self, ctx):
        """The parser, refusing an option of one value given twice: click keeps the last one and
        drops the others without a word (`push --dialogues A --dialogues B` published B only)."""
        parser = super().make_parser(ctx)
        parse = parser.parse_args

        def parse_once(args):
            opts, rest, order = parse(args=args)
            refuse_repeated(ctx, order)
            return opts, rest, order

        parser.parse_args = parse_once
        return parser

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except Exception as error:  # (by name: typer may bundle its own click)
            if type(error).__name__ == "NoSuchOption" and self.name == "run":  # a stage's flag: which key
                error.message += run_takes(error.option_name)
            raise


def refuse_repeated(ctx, order: list) -> None:
    """One line for an option that takes one value, given more than once (the parser's `order`
    holds each occurrence); a repeatable option (a list) and an on/off flag are left alone."""
    from collections import Counter

    counts = Counter(
        param for param in order
        if getattr(param, "param_type_name", "") == "option" and not param.multiple and not param.is_flag
        and not param.count
    )  # fmt: skip
    for param, times in counts.items():
        if times > 1:
            ctx.fail(f"{param.opts[0]} takes one value and was given {times} times: give it once")


def run_takes(flag: str) -> str:
    """What `run --limit` means: the keys of the sections run reads that have that flag, in the
    order run meets them on the usual input (AlpsBench: filter, infer-persona, gen-queries...);
    extract-memories, which runs only on a conversation log, last."""
    from personaemp.registry import RUN_COMMANDS

    sections = dict.fromkeys(s for c in (*RUN_COMMANDS, "extract-memories") for s in COMMANDS[c])
    keys = [
        f"{section}.{option.name}" for section in sections for option in specs(section)
        if flag in "/".join(option.flags).split("/")
    ]  # fmt: skip
    if not keys:
        return ""
    return f" ({flag} is {', '.join(keys)} for run: --set {keys[0]}=... or a key of the --config file)"


app = typer.Typer(
    help="Build personalized-empathy datasets (PersonaEmp) from long-term user-AI interaction data.",
    cls=_Group,
    no_args_is_help=True,
    invoke_without_command=True,
    add_completion=True,  # --install-completion / --show-completion
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
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
    import signal

    # Started with SIGINT ignored (`personaemp run &` in a script), a run went on after
    # `kill -INT` while its filter child, which resets it, died: Ctrl-C always stops it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.unraisablehook = _ctrl_c_raised_again(sys.unraisablehook)
    try:
        try:
            app(prog_name="personaemp")
            code = 0
        except SystemExit as done:  # how click ends: its code, or a message for stderr
            code = done.code
            if isinstance(code, str):
                sys.stderr.write(code + "\n")
                code = 1
        # From here a Ctrl-C is only noted: one that came as the command ended, in the exit
        # handlers (which print and drop it), was lost, the exit code 0.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    except KeyboardInterrupt:  # outside a command (parsing the flags), or a second Ctrl-C
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        code = interrupted()
    atexit._run_exitfuncs()
    if signal.SIGINT in signal.sigpending() and code != 130:  # (130: the user was told)
        code = interrupted()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def _ctrl_c_raised_again(previous):
    """A Ctrl-C that lands where Python cannot raise (an after-fork hook such as filelock's,
    as stats forks its plot workers; a finalizer) was printed as "Exception ignored" and
    lost: the run went on to exit 0. It is sent again to the main thread instead, from
    another thread a moment later (raised from here it fired inside this hook, lost again);
    a real signal, so that a main thread blocked in a wait wakes up to it."""
    import signal
    import threading

    def again() -> None:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous(unraisable)
            return
        while True:
            try:
                timer = threading.Timer(0.01, again)
                timer.daemon = True
                timer.start()
                return
            except KeyboardInterrupt:
                # On a loaded machine the signal can come before start() returns, inside this
                # hook, and be lost again: send another one.
                continue

    return hook


WIDE = 1000  # columns of a console that is not a terminal: a table piped to a file is not cut


def console_for(stderr: bool = True, quiet: bool = False) -> Console:
    """A terminal's width on a terminal; else (a pipe, a file) wide, unless COLUMNS says."""
    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=stderr, soft_wrap=True, quiet=quiet, width=WIDE if wide else None)


def stderr_console(quiet: bool = False) -> Console:
    return console_for(stderr=True, quiet=quiet)


def _keyword(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def output_options() -> list[inspect.Parameter]:
    """-q/--quiet and --json, declared once for every stage command, `run` and `merge`."""
    flags = {"quiet": ("--quiet", "-q"), "json_output": ("--json",)}
    return [_keyword(name, Annotated[bool, typer.Option(*given, help=OUTPUT_OPTIONS[given[0]])], False)
            for name, given in flags.items()]  # fmt: skip


def only(command: str, flag: str, kind: Any = bool, metavar: str | None = None) -> Any:
    """A command-only flag (options.CLI_ONLY): its annotation, evaluated by stage_command (eval_str)."""
    if kind is bool:
        return Annotated[bool, typer.Option(flag, help=CLI_ONLY[command][flag])]
    return Annotated[kind | None, typer.Option(flag, metavar=metavar, help=CLI_ONLY[command][flag])]


def print_json(result: Any) -> None:
    """A command's result on stdout (StageResult, or `run`'s results): one JSON document."""
    import json

    if result is None:
        return
    plain = result.as_dict() if hasattr(result, "as_dict") else result  # agreement, export: a dict
    sys.stdout.write(json.dumps(plain, ensure_ascii=False, indent=2, default=str) + "\n")


def with_output_options(command):
    """`command(console, ...)` -> the Typer command with --quiet/--json: it gets the
    console the flags ask for and returns a result, printed as JSON with --json."""
    signature = inspect.signature(command, eval_str=True)
    parameters = [p for name, p in signature.parameters.items() if name != "console"]

    @functools.wraps(command)
    def wrapper(*args, quiet: bool = False, json_output: bool = False, **kwargs):
        result = command(*args, console=stderr_console(quiet), **kwargs)
        if json_output:
            print_json(result)
        stop_if_failed(result)

    wrapper.__signature__ = signature.replace(parameters=[*parameters, *output_options()])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {}
    return wrapper


INTERRUPTED = "Interrupted — run it again to resume"


def interrupted() -> int:
    """Ctrl-C: one line (finished outputs are kept; a re-run resumes), and exit code 130."""
    sys.stderr.write(INTERRUPTED + "\n")
    sys.stderr.flush()
    return 130


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
            raise typer.Exit(interrupted()) from None
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


def _typer_parameter(option: OptionSpec, section: str) -> inspect.Parameter:
    """One option of a model as a Typer parameter. Values reach the model unparsed (as
    text), so a bad flag, env var or TOML value gets the same one-line error."""
    default = option.default
    common = {
        "help": escape(option.help),
        "rich_help_panel": LLM_PANEL if section == "llm" else None,
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
    return _keyword(option.name, annotation, value)


def _old_parameter(option: OptionSpec) -> inspect.Parameter:
    """The option's earlier flag (Opt.renamed_from), hidden: it works, with a notice."""
    assert option.kind == "value", "only value options were renamed"
    return _keyword(f"old_{option.name}", Annotated[str | None, typer.Option(option.old_flag, hidden=True)])


def section_parameters(sections: tuple[str, ...]) -> tuple[list[inspect.Parameter], list[inspect.Parameter]]:
    """The Typer parameters of every option of `sections`, and the hidden ones of their earlier flags."""
    options = [(section, option) for section in sections for option in specs(section)]
    generated = [_typer_parameter(option, section) for section, option in options]
    return generated, [_old_parameter(option) for _, option in options if option.old_flag]


def given_flags(ctx: typer.Context, sections: tuple[str, ...], values: dict[str, Any]) -> dict[str, dict]:
    """{section: {option: value}} of the options of `sections` given on the command line (or by
    their earlier flag, with a notice), as the resolver takes them; their values leave `values`."""
    from personaemp.config import cli_flags

    flags: dict[str, dict[str, Any]] = {section: {} for section in sections}
    for section in sections:
        for option in specs(section):
            value = values.pop(option.name)
            earlier = values.pop(f"old_{option.name}", None) if option.old_flag else None
            source = ctx.get_parameter_source(option.name)  # (by name: typer may bundle its own click)
            if source is not None and source.name == "COMMANDLINE":
                flags[section][option.name] = value
            elif earlier is not None:
                notice_renamed(option.old_flag, option.flag)
                flags[section][option.name] = earlier
    return {section: cli_flags(section, given) for section, given in flags.items()}


_COMMANDS: dict[str, Callable] = {}  # name -> command, registered on `app` in ORDER at the end


def stage_command(name: str):
    """Register `func(options: Resolver, console: Console, **cli_only)` as the stage command
    `name`; it returns its StageResult (printed with --json) or None.

    The command's options are the fields of its sections (personaemp.options.COMMANDS),
    plus --config and the command-only parameters `func` declares itself. Only the
    options given on the command line are passed on: env vars, the config file and the
    defaults are layered under them by the resolver, exactly as `personaemp run` does."""
    sections = COMMANDS[name]

    def register(func):
        declared = list(inspect.signature(func, eval_str=True).parameters.values())[2:]
        wants_json = any(parameter.name == "json_output" for parameter in declared)  # told of --json
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in declared if p.name != "json_output"]
        generated, old = section_parameters(sections)
        config_flag = typer.Option("--config", "-c", metavar="FILE", help=CLI_ONLY[name]["--config"])
        config = _keyword("config", Annotated[Path | None, config_flag])

        def command(ctx: typer.Context, config: Path | None = None, quiet=False, json_output=False, **values):
            from personaemp.paths import check_command

            resolver = Resolver(config, flags=given_flags(ctx, sections, values), style="cli")
            check_command(name, resolver.section)
            if wants_json:
                values["json_output"] = json_output
            result = func(resolver, stderr_console(quiet), **values)
            if json_output:
                print_json(result)
            stop_if_failed(result)

        context = _keyword("ctx", typer.Context, inspect.Parameter.empty)
        parameters = [context, config, *generated, *own, *output_options(), *old]
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__name__, command.__doc__ = func.__name__, func.__doc__ or STAGES[name].help
        command.__annotations__ = {}
        _COMMANDS[name] = reports_errors(command)
        return func

    return register


@stage_command("filter")
def filter_command(
    options: Resolver,
    console: Console,
    show_rules: only("filter", "--show-rules") = False,
):
    if show_rules:
        from personaemp.rules import default_rules_text

        typer.echo(default_rules_text(), nl=False)
        return None
    return STAGES["filter"].run(options, console)


@stage_command("infer-persona")
def infer_persona_command(
    options: Resolver,
    console: Console,
    show: only("infer-persona", "--show", str, "USER") = None,
):
    if show is not None:
        from personaemp.summaries import print_persona

        print_persona(options.persona.output, show, console_for(stderr=False))
        return None
    return STAGES["infer-persona"].run(options, console)


@stage_command("evaluate")
def evaluate_command(options: Resolver, console: Console, json_output: bool = False):
    from personaemp.summaries import print_evaluation

    result = STAGES["evaluate"].run(options, console)
    if result.summary is not None:  # None after --estimate
        # The tables are the command's output (stdout), unless --json holds stdout: then stderr.
        print_evaluation(result.summary, console if json_output else console_for(stderr=False))
    return result


@stage_command("table")
def table_command(options: Resolver, console: Console):
    text = STAGES["table"].run(options, console)
    if options.section("table").output is None:
        print(text, end="")
    else:
        console.print(f"wrote {options.section('table').output}")
    return text


@stage_command("review")
def review_command(
    options: Resolver,
    console: Console,
    export_label_studio: only("review", "--export-label-studio", Path, "DIR") = None,
    import_label_studio: only("review", "--import-label-studio", Path, "FILE") = None,
):
    if export_label_studio or import_label_studio:
        from personaemp.review.label_studio import exchange_label_studio

        return exchange_label_studio(
            options.section("review"), export_label_studio, import_label_studio, console
        )
    return STAGES["review"].run(options, console)


# fmt: off
@with_output_options
def merge_command(
    stage: Annotated[str, typer.Argument(
        metavar="STAGE", help="The stage run as shards: extract-memories, infer-persona or gen-queries.")],
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", metavar="FILE", help="personaemp.toml to read the stage's paths from.")] = None,
    input: Annotated[Path | None, typer.Option(  # noqa: A002 - the flag's name
        "--input", "-i", metavar="PATH", help="The stage's input (default: from the config).")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="PATH",
        help="The stage's output; the shards are beside it (default: config).")] = None,
    *,
    console: Console,
):
    """Join the shard files of an LLM stage (--shard I/N) into its output, checking that
    every user is in exactly one shard."""
    from personaemp.config import load_config
    from personaemp.dataset.merge import from_options

    return from_options(stage, load_config(config), console, input_path=input, output=output)


def serve_local_command(
    host: Annotated[str, typer.Option(metavar="ADDRESS", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="INTEGER", help="Port to listen on.")] = 8011,
    n_ctx: Annotated[int, typer.Option(metavar="INTEGER", help="Context size in tokens.")] = 8192,
) -> None:
    """Serve the embedded model (OpenAI-compatible, foreground) for other tools; Ctrl-C stops it."""
    from personaemp.llm.local import serve_local

    code = serve_local(host=host, port=port, n_ctx=n_ctx)
    if code:
        raise typer.Exit(code)


# `run`'s flags: every LLM stage's [llm] options (endpoint, model, concurrency, executor...),
# as the stages declare them; a stage's own keys (several share --limit, --input) go by --set.
RUN_SECTIONS = ("llm",)


def run_command(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", metavar="FILE", help="personaemp.toml (default: built-in settings).")] = None,
    settings: Annotated[list[str] | None, typer.Option(
        "--set", metavar="SECTION.KEY=VALUE",
        help="Any key of the config for this run, its value as in the file (repeatable): --set "
        "persona.limit=8 --set 'persona.users=[\"a\", \"b\"]' --set llm.vllm.engine.max_model_len=8192. "
        "Wins over the file and env vars.")] = None,
    *,
    console: Console,
    **values: Any,
):
    """Run (extract-memories ->) filter -> infer-persona -> gen-queries -> split -> stats -> push from
    one config, resuming. A stage's options are keys of its section (--set or the file); the LLM
    options are flags, as for every LLM stage."""
    from personaemp.config import load_config
    from personaemp.pipeline import run_pipeline

    flags = given_flags(ctx, RUN_SECTIONS, values)
    options = load_config(config, settings=settings, flags=flags)  # every section: a bad value stops here
    return run_pipeline(options, console)
# fmt: on


def _run_signature() -> inspect.Signature:
    """run_command's own parameters, then the flags of RUN_SECTIONS (generated, as a stage's)."""
    own = [p for p in inspect.signature(run_command, eval_str=True).parameters.values() if p.name != "values"]
    generated, old = section_parameters(RUN_SECTIONS)
    return inspect.Signature([*own, *generated, *old])


run_command.__signature__ = _run_signature()  # type: ignore[attr-defined]
run_command = with_output_options(run_command)


def _runs(name: str):
    """The command of a stage that needs nothing but its options."""

    def command(options: Resolver, console: Console):
        return STAGES[name].run(options, console)

    return command


for _name in STAGES:
    if _name not in _COMMANDS:
        stage_command(_name)(_runs(_name))
_COMMANDS.update(
    {name: reports_errors(command) for name, command in
     (("merge", merge_command), ("serve-local", serve_local_command), ("run", run_command))}
)  # fmt: skip
ORDER = ("extract-memories", "filter", "infer-persona", "gen-queries", "merge", "serve-local", "split",
         "stats", "push", "run", "gen-dialogues", "criteria", "respond", "export", "evaluate", "table",
         "review", "agreement")  # fmt: skip


def _paragraphs(text: str | None) -> str | None:
    """A command's help as --help shows it: a line break inside a paragraph (a docstring's
    wrapping) is a space, or rich keeps it and the line breaks mid-sentence."""
    if text is None:
        return None
    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(text))
    return "\n\n".join(" ".join(part.split()) for part in paragraphs)


for _name in [*ORDER, *(name for name in _COMMANDS if name not in ORDER)]:  # a new stage: last
    app.command(_name, cls=_Command, help=_paragraphs(_COMMANDS[_name].__doc__))(_COMMANDS[_name])

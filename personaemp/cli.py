"""The `personaemp` command line: the Typer app (group, --version, completion) and its
commands, click objects built below from the option specs (`stage_command`, `commands()`)."""

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

from personaemp.catalogue import CLI_ONLY, COMMANDS, OUTPUT_OPTIONS, RUN_COMMANDS
from personaemp.config import Resolver
from personaemp.errors import PersonaempError
from personaemp.options import OptionSpec, notice_renamed, show_default, specs
from personaemp.registry import STAGES
from personaemp.results import stop_if_failed
from personaemp.shared_options import LLM_PANEL


def _clean_help(params: list) -> list:
    """No type placeholder after a flag (typer shows `<bool>` for --ood/--no-ood, --help...)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif param.param_type_name == "argument" and param.metavar:  # its name says it: no <str>
            param.display_type_rich = lambda ctx: None
    return params


class _Group(TyperGroup):
    """The app's group: the commands are click objects (`commands()` below), added as it is made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, command in commands().items():
            self.add_command(command, name)

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


def print_json(result: Any) -> None:
    """A command's result on stdout (StageResult, or `run`'s results): one JSON document."""
    import json

    if result is None:
        return
    plain = result.as_dict() if hasattr(result, "as_dict") else result  # agreement, export: a dict
    sys.stdout.write(json.dumps(plain, ensure_ascii=False, indent=2, default=str) + "\n")


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


# --- the commands: click objects, their parameters made from the option specs -----------------


def param(name: str, kind: Any, info: Any):
    """One click parameter, as Typer makes it from a function's parameter `name: kind = info`
    (a typer.Option or typer.Argument): the same object, so --help renders as Typer renders it."""
    from typer.models import ParamMeta

    meta = ParamMeta(name=name, default=info, annotation=kind)
    make = getattr(typer.main, "_get_param", None)  # typer 0.29; earlier releases: get_click_param
    return make(meta) if make is not None else typer.main.get_click_param(meta)[0]


def option(name: str, kind: Any, *flags: str, default: Any = None, **info: Any):
    """`--flag` of type `kind` (flags default to --name), its value passed on as `name`."""
    return param(name, kind, typer.Option(default, *flags, **info))


def output_params() -> list:
    """-q/--quiet and --json, declared once for every stage command, `run` and `merge`."""
    return [
        option("quiet", bool, "--quiet", "-q", default=False, help=OUTPUT_OPTIONS["--quiet"]),
        option("json_output", bool, "--json", default=False, help=OUTPUT_OPTIONS["--json"]),
    ]


def spec_param(spec: OptionSpec, section: str):
    """One option of a section as a flag. Values reach the model unparsed (as text), so a bad
    flag, env var or TOML value gets the same one-line error."""
    common = {
        "help": escape(spec.help),
        "rich_help_panel": LLM_PANEL if section == "llm" else None,
        "envvar": spec.opt.env,  # shown in --help; the value itself is read by the resolver
        "show_envvar": bool(spec.opt.env),
    }
    if spec.kind == "bool":
        return option(spec.name, bool, *spec.flags, default=spec.default, **common)
    if spec.kind in ("list", "dict"):
        default = [str(item) for item in spec.default] or None if isinstance(spec.default, list) else None
        return option(
            spec.name, list[str] | None, *spec.flags, default=default, metavar=spec.metavar, **common
        )
    return option(spec.name, str | None, *spec.flags, default=show_default(spec.default) or None,
                  metavar=spec.metavar, **common)  # fmt: skip


def section_params(sections: tuple[str, ...]) -> tuple[list, list]:
    """The flags of every option of `sections`, and the hidden ones of their earlier names
    (Opt.renamed_from: they work, with a notice)."""
    specs_of = [(section, spec) for section in sections for spec in specs(section)]
    flags = [spec_param(spec, section) for section, spec in specs_of]
    earlier = [option(f"old_{spec.name}", str | None, spec.old_flag, hidden=True) for _, spec in specs_of
               if spec.old_flag]  # fmt: skip
    return flags, earlier


def given_flags(ctx, sections: tuple[str, ...], values: dict[str, Any]) -> dict[str, dict]:
    """{section: {option: value}} of the options of `sections` given on the command line (or by
    their earlier flag, with a notice), as the resolver takes them; their values leave `values`."""
    from personaemp.config import cli_flags

    flags: dict[str, dict[str, Any]] = {section: {} for section in sections}
    for section in sections:
        for spec in specs(section):
            value = values.pop(spec.name)
            earlier = values.pop(f"old_{spec.name}", None) if spec.old_flag else None
            source = ctx.get_parameter_source(spec.name)  # (by name: typer may bundle its own click)
            if source is not None and source.name == "COMMANDLINE":
                flags[section][spec.name] = list(value) if isinstance(value, tuple) else value
            elif earlier is not None:
                notice_renamed(spec.old_flag, spec.flag)
                flags[section][spec.name] = earlier
    return {section: cli_flags(section, given) for section, given in flags.items()}


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """click's values as Python takes them: a repeated option's tuple a list, none given None."""
    return {
        name: (list(value) or None) if isinstance(value, tuple) else value for name, value in values.items()
    }


def paragraphs(text: str) -> str:
    """A command's help as --help shows it: a line break inside a paragraph (a docstring's
    wrapping) is a space, or rich keeps it and the line breaks mid-sentence."""
    parts = re.split(r"\n\s*\n", inspect.cleandoc(text))
    return "\n\n".join(" ".join(part.split()) for part in parts)


class OutputCommand(_Command):
    """A command with --quiet/--json: `act(console, **values)` returns its result, printed as
    JSON with --json; a failed result exits 1; errors are one line (reports_errors)."""

    def __init__(self, name: str, act: Callable, params: list, help: str):  # noqa: A002 - click's
        super().__init__(name, params=[*params, *output_params()], help=paragraphs(help))
        self.act = act

    def invoke(self, ctx):
        return reports_errors(self._invoke)(ctx)

    def _invoke(self, ctx):
        values = _plain(ctx.params)
        quiet, json_output = values.pop("quiet"), values.pop("json_output")
        result = self.act(ctx, stderr_console(quiet), json_output=json_output, **values)
        if json_output:
            print_json(result)
        stop_if_failed(result)


def stage_command(name: str, act: Callable | None = None, own: tuple = ()) -> OutputCommand:
    """The command of stage `name`: --config, the flags of its sections
    (personaemp.catalogue.COMMANDS: each option of personaemp.options' specs), its command-only
    flags `own`, --quiet/--json. Only the options given on the command line are passed on: env
    vars, the config file and the defaults are layered under them by the resolver, exactly as
    `personaemp run` does. `act(options, console, json_output, **own)` returns its StageResult
    (printed with --json) or None; by default the stage's run."""
    sections = COMMANDS[name]
    flags, earlier = section_params(sections)
    config = option("config", Path | None, "--config", "-c", metavar="FILE", help=CLI_ONLY[name]["--config"])

    def run(ctx, console: Console, json_output: bool, config: Path | None = None, **values):
        from personaemp.paths import check_command

        options = Resolver(config and Path(config), flags=given_flags(ctx, sections, values), style="cli")
        check_command(name, options.section)
        if act is None:
            return STAGES[name].run(options, console)
        return act(options, console, json_output=json_output, **values)

    command = OutputCommand(name, run, [config, *flags, *own], STAGES[name].help)
    command.params += earlier  # hidden, after --quiet/--json as before
    return command


def only(command: str, name: str, flag: str, kind: Any = bool, metavar: str | None = None):
    """A command-only flag (catalogue.CLI_ONLY: no TOML key)."""
    if kind is bool:
        return option(name, bool, flag, default=False, help=CLI_ONLY[command][flag])
    return option(name, kind | None, flag, metavar=metavar, help=CLI_ONLY[command][flag])


def show_rules_or_filter(options: Resolver, console: Console, json_output: bool, show_rules: bool):
    if show_rules:
        from personaemp.rules import default_rules_text

        typer.echo(default_rules_text(), nl=False)
        return None
    return STAGES["filter"].run(options, console)


def show_or_infer_personas(options: Resolver, console: Console, json_output: bool, show: str | None):
    if show is not None:
        from personaemp.dataset.persona import print_persona

        print_persona(options.persona.output, show, console_for(stderr=False))
        return None
    return STAGES["infer-persona"].run(options, console)


def evaluate_and_print(options: Resolver, console: Console, json_output: bool):
    from personaemp.evaluation.scoreboard import print_evaluation

    result = STAGES["evaluate"].run(options, console)
    if result.summary is not None:  # None after --estimate
        # The tables are the command's output (stdout), unless --json holds stdout: then stderr.
        print_evaluation(result.summary, console if json_output else console_for(stderr=False))
    return result


def write_table(options: Resolver, console: Console, json_output: bool):
    text = STAGES["table"].run(options, console)
    if options.section("table").output is None:
        print(text, end="")
    else:
        console.print(f"wrote {options.section('table').output}")
    return text


def review_or_exchange(options: Resolver, console: Console, json_output: bool, export_label_studio,
                       import_label_studio):  # fmt: skip
    if export_label_studio or import_label_studio:
        from personaemp.review.label_studio import exchange_label_studio

        exported = export_label_studio and Path(export_label_studio)
        imported = import_label_studio and Path(import_label_studio)
        return exchange_label_studio(options.section("review"), exported, imported, console)
    return STAGES["review"].run(options, console)


def merge(ctx, console: Console, json_output: bool, stage: str, config=None, input=None, output=None):  # noqa: A002
    from personaemp.config import load_config
    from personaemp.dataset.merge import from_options

    paths = {"input_path": input and Path(input), "output": output and Path(output)}
    return from_options(stage, load_config(config and Path(config)), console, **paths)


MERGE = [
    param("stage", str, typer.Argument(..., metavar="STAGE", help="The stage run as shards: "
                                       "extract-memories, infer-persona or gen-queries.")),
    option("config", Path | None, "--config", "-c", metavar="FILE",
           help="personaemp.toml to read the stage's paths from."),
    option("input", Path | None, "--input", "-i", metavar="PATH",
           help="The stage's input (default: from the config)."),
    option("output", Path | None, "--output", "-o", metavar="PATH",
           help="The stage's output; the shards are beside it (default: config)."),
]  # fmt: skip


def serve_local(host: str, port: int, n_ctx: int) -> None:
    from personaemp.llm.local import serve_local

    code = serve_local(host=host, port=port, n_ctx=n_ctx)
    if code:
        raise typer.Exit(code)


def serve_local_command() -> _Command:
    return _Command(
        "serve-local",
        params=[
            option("host", str, default="127.0.0.1", metavar="ADDRESS", help="Address to listen on."),
            option("port", int, default=8011, metavar="INTEGER", help="Port to listen on."),
            option("n_ctx", int, default=8192, metavar="INTEGER", help="Context size in tokens."),
        ],
        callback=reports_errors(serve_local),
        help="Serve the embedded model (OpenAI-compatible, foreground) for other tools; Ctrl-C stops it.",
    )


# `run`'s flags: every LLM stage's [llm] options (endpoint, model, concurrency, executor...),
# as the stages declare them; a stage's own keys (several share --limit, --input) go by --set.
RUN_SECTIONS = ("llm",)


def run_pipeline(ctx, console: Console, json_output: bool, config=None, settings=None, **values):
    from personaemp.config import load_config
    from personaemp.pipeline import run_pipeline

    flags = given_flags(ctx, RUN_SECTIONS, values)
    options = load_config(config and Path(config), settings=settings, flags=flags)  # a bad value stops here
    return run_pipeline(options, console)


def run_command() -> OutputCommand:
    flags, earlier = section_params(RUN_SECTIONS)
    own = [
        option("config", Path | None, "--config", "-c", metavar="FILE",
               help="personaemp.toml (default: built-in settings)."),
        option("settings", list[str] | None, "--set", metavar="SECTION.KEY=VALUE",
               help="Any key of the config for this run, its value as in the file (repeatable): --set "
               "persona.limit=8 --set 'persona.users=[\"a\", \"b\"]' --set "
               "llm.vllm.engine.max_model_len=8192. Wins over the file and env vars."),
    ]  # fmt: skip
    return OutputCommand(
        "run", run_pipeline, [*own, *flags, *earlier],
        """Run (extract-memories ->) filter -> infer-persona -> gen-queries -> split -> stats -> push from
        one config, resuming. A stage's options are keys of its section (--set or the file); the LLM
        options are flags, as for every LLM stage.""",
    )  # fmt: skip


def commands() -> dict[str, _Command]:
    """Every command by name, in the order --help lists them (a new stage: last). Made anew for
    each group, as Typer makes its commands: click keeps a command's help option from the first
    context it sees (-h comes from the group's), so a command is never shared between groups."""
    made = {
        "filter": stage_command(
            "filter", show_rules_or_filter, (only("filter", "show_rules", "--show-rules"),)
        ),
        "infer-persona": stage_command(
            "infer-persona", show_or_infer_personas, (only("infer-persona", "show", "--show", str, "USER"),)
        ),
        "evaluate": stage_command("evaluate", evaluate_and_print),
        "table": stage_command("table", write_table),
        "review": stage_command("review", review_or_exchange, (
            only("review", "export_label_studio", "--export-label-studio", Path, "DIR"),
            only("review", "import_label_studio", "--import-label-studio", Path, "FILE"),
        )),
        "merge": OutputCommand(
            "merge", merge, MERGE,
            """Join the shard files of an LLM stage (--shard I/N) into its output, checking that
            every user is in exactly one shard.""",
        ),
        "serve-local": serve_local_command(),
        "run": run_command(),
    }  # fmt: skip
    for name in STAGES:
        made.setdefault(name, stage_command(name))
    order = ("extract-memories", "filter", "infer-persona", "gen-queries", "merge", "serve-local", "split",
             "stats", "push", "run", "gen-dialogues", "criteria", "respond", "export", "evaluate", "table",
             "review", "agreement")  # fmt: skip
    return {name: made[name] for name in [*order, *(name for name in made if name not in order)]}

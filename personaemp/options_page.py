"""The option tables of the docs' Options page (docs/options.md), generated from the
declared sections: `python -m personaemp.registry docs/options.md` rewrites the block
between the markers; tests/integration/test_options.py checks it is up to date."""

from __future__ import annotations

from pathlib import Path

from personaemp.options import OptionSpec, show_default, specs

BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _flag_cell(option: OptionSpec) -> str:
    shown = " ".join(f"`{flag}`" for part in option.flags for flag in part.split("/"))
    return shown + (" (repeatable)" if option.kind in ("list", "dict") else "")


def _formerly(option: OptionSpec) -> str:
    old = option.opt.renamed_from
    return f" Formerly `{option.old_flag}` / `{old}` (still read, with a notice)." if old else ""


def _table(options: list[OptionSpec]) -> list[str]:
    lines = ["| option | TOML key | env var | default | meaning |", "|---|---|---|---|---|"]
    for option in options:
        default = show_default(option.default)
        derived = option.opt.derive
        if derived:
            source = (
                f"`<processed>/{derived.split(':', 1)[1]}`"
                if derived.startswith("processed:")
                else f"`[{derived.split('.')[0]}] {derived.split('.')[1]}`"
            )
            default = f"`{default}`; in a config: {source}"
        elif default:
            default = f"`{default}`"
        else:
            default = "—"
        lines.append(
            "| "
            + " | ".join(
                [
                    _flag_cell(option),
                    f"`{option.name}`",
                    f"`{option.opt.env}`" if option.opt.env else "",
                    _cell(default),
                    _cell(option.help + _formerly(option)),
                ]
            )
            + " |"
        )
    return lines


def markdown_tables() -> str:
    """The option tables, from the models (between BEGIN and END in docs/options.md)."""
    out: list[str] = [
        "<!-- generated from the options modules: python -m personaemp.registry docs/options.md -->",
        "",
    ]
    from personaemp.catalogue import CLI_ONLY, COMMANDS

    for command, names in COMMANDS.items():
        out.append(f"#### `personaemp {command}` — TOML `[{names[0]}]`")
        out.append("")
        out.extend(_table(specs(names[0])))
        out.append("")
        if "llm" in names:
            out.append("And the LLM options below (TOML `[llm]`).")
        only = "; ".join(
            f"`{flag}`: {text[0].lower() + text[1:].rstrip('.')}" for flag, text in CLI_ONLY[command].items()
        )
        out.append(f"Command-only (no TOML key): {only}.")
        out.append("")
    out.append("#### LLM options of every LLM command — TOML `[llm]`")
    out.append("")
    out.extend(_table(specs("llm")))
    out.append("")
    out.append("#### The training reward (`personaemp.reward.from_config`) — TOML `[reward]`")
    out.append("")
    out.append("| TOML key | env var | default | meaning |")
    out.append("|---|---|---|---|")
    for option in specs("reward"):
        default = show_default(option.default)
        out.append(
            f"| `{option.name}` | {f'`{option.opt.env}`' if option.opt.env else ''} | "
            f"{f'`{default}`' if default else '—'} | {_cell(option.help)} |"
        )
    out.append("")
    out.append("#### `personaemp run` — TOML `[paths]`")
    out.append("")
    out.append("| TOML key | default | meaning |")
    out.append("|---|---|---|")
    for option in specs("paths"):
        out.append(f"| `{option.name}` | `{show_default(option.default)}` | {_cell(option.help)} |")
    return "\n".join(out) + "\n"


def update_readme(path: Path) -> bool:
    """Rewrite the block between the markers of the options page (docs/options.md, which
    the README links to; the name is older than the page); True if the file changed."""
    text = path.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:start] + "\n" + markdown_tables() + text[end:]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def readme_block(text: str) -> str:
    """What the options page (docs/options.md) holds between the markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].removeprefix("\n")

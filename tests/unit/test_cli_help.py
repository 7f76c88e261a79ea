"""Every option and argument of every `runbus` command says what it is in `--help`."""

import argparse

from runbus.cli import build_parser


def parsers(
    parser: argparse.ArgumentParser, name: str = "runbus"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += parsers(sub, f"{name} {sub_name}")
    return found


def test_every_option_and_argument_of_every_command_has_help() -> None:
    missing = [
        f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
        for name, parser in parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]

    assert missing == []

"""The `millm` command: `millm serve [options]`; every option also reads an environment variable."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing

from pydantic import ValidationError

from millm.settings import Settings, settings_options, settings_with


def _option_type(name: str):
    annotation = Settings.model_fields[name].annotation
    choices = None
    if typing.get_origin(annotation) is typing.Literal:
        choices = list(typing.get_args(annotation))
    return annotation, choices


def add_settings_options(parser: argparse.ArgumentParser) -> None:
    """One --option per setting, its help naming the environment variable and default."""
    for name, env, default, description in settings_options():
        flag = "--" + name.replace("_", "-")
        annotation, choices = _option_type(name)
        shown = "per-user data folder" if name == "home" else default
        help_text = f"{description} [env: {env}; default: {shown}]"
        if annotation == list[str]:  # repeatable: --sae A --sae B
            parser.add_argument(
                flag, dest=name, action="append", default=None, metavar=env, help=help_text
            )
        elif annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            parser.add_argument(
                flag,
                dest=name,
                default=None,
                choices=choices,
                metavar=None if choices else env,
                help=help_text,
            )


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with its `serve` sub-command."""
    parser = argparse.ArgumentParser(
        prog="millm", description="OpenAI-compatible server with SAE feature steering."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="start the server (the demo model when --model is not given)",
        description="Start the OpenAI-compatible server. Options override their environment "
        "variables.",
    )
    add_settings_options(serve)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the options given on the command line."""
    given = {
        name: getattr(args, name)
        for name in Settings.model_fields
        if getattr(args, name, None) is not None
    }
    return settings_with(given)


def serve(settings: Settings) -> int:
    """Resolve the model at once (clear error, no traceback), then serve while it loads."""
    import uvicorn

    from millm.engine.sources import resolve_source
    from millm.errors import MillmError, ModelSourceError, StoreUnavailable
    from millm.kernel.model.engines import check_engine_setting
    from millm.server.access import open_routes_warning
    from millm.server.app import create_app
    from millm.server.composition import build_state
    from millm.server.facades import build_facades
    from millm.store.single_process import DatabaseInUse

    settings.home.mkdir(parents=True, exist_ok=True)
    if settings.reproducible:
        from millm.engine.numerics import fix_cpu_numerics

        fix_cpu_numerics()
    try:
        check_engine_setting(settings.engine)
        source = resolve_source(settings.model, settings.hub_dir)
    except ModelSourceError as exc:
        print(f"millm: {exc}", file=sys.stderr)
        return 2
    try:
        state = build_state(settings, source)
    except (DatabaseInUse, StoreUnavailable) as exc:
        print(f"millm: {exc}", file=sys.stderr)
        return 2
    try:  # --sae: a wrong name or an unreadable file stops the start, as a wrong --model does
        state.switch.startup_saes.register()
    except MillmError as exc:
        print(f"millm: {exc.message}", file=sys.stderr)
        state.close()
        return 2
    app = create_app(build_facades(state))
    log = logging.getLogger("millm")
    log.info("data directory: %s", settings.home)
    warning = open_routes_warning(settings.host, settings.api_key, settings.admin_key)
    if warning is not None:
        log.warning(warning)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and of `python -m millm`."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        flags = {env: "--" + name.replace("_", "-") for name, env, _, _ in settings_options()}
        for error in exc.errors():
            env = str(error["loc"][0]) if error["loc"] else ""
            if env in flags:
                print(
                    f"millm: invalid value for {flags[env]} (env {env}): {error['msg']}",
                    file=sys.stderr,
                )
            else:  # a rule across settings (the keys); pydantic prefixes its message
                print(f"millm: {error['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Alembic narrates every start (its set-up and each migration step) at info: warnings and errors
    # only.
    logging.getLogger("alembic").setLevel(
        max(logging.WARNING, logging.getLevelName(settings.log_level.upper()))
    )
    # The MCP SDK logs each stateless /mcp call's transport ending at info; uvicorn's access line
    # says enough.
    logging.getLogger("mcp").setLevel(
        max(logging.WARNING, logging.getLevelName(settings.log_level.upper()))
    )
    if args.command == "serve":
        return serve(settings)
    return 2

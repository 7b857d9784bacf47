"""Bad input on the command line, in the config and in the environment: one line on stderr, exit
2, no traceback and no password, before anything connects. Found by driving `pg-purge` with
bad input from outside; every case here ended in a traceback, a usage block or a late error.
Temporal's address is a closed port, so a command that got as far as connecting would say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from purge_config.errors import ConfigError
from purge_config.file import load_config
from tests.support.procs import Done, clean_env, run_main

SECRET = "s3cret-of-the-cli"
#: Nothing listens there: reaching Temporal would fail with status 1, not 2.
CLOSED = "127.0.0.1:1"


#: A `kind = "python"` target, added to a config: its factory may provide more than its names.
PYTHON_TARGET = (
    '[[targets]]\nkind = "python"\nfactory = "tests.support.apptargets:targets"\n'
    'names = ["tmp_uploads"]\n'
)


def one_line(done: Done) -> str:
    """The one line a refused command printed; fails on a traceback, a usage block or a secret."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pg-purge"), done.stderr
    assert "Traceback" not in done.stderr
    assert SECRET not in done.stderr + done.stdout
    return lines[0]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "purge.toml"
    path.write_text('[[targets]]\nkind = "idempotency"\n', encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run", "--metrics", "nohost"], "--metrics: want HOST:PORT"),
        (["run", "--metrics", "127.0.0.1:99999"], "--metrics: want HOST:PORT"),
        (["run", "--metrics", "127.0.0.1:0"], "--metrics: want HOST:PORT"),
        (["report", "--last", "0"], "--last: want a whole number"),
        (["run", "--max-sweeps", "100000000000000000000"], "--max-sweeps: want a whole number"),
        (["sweep", "--target", "a b"], "--target: not a target name"),
        (["run", "--bogus"], "unrecognized arguments: --bogus"),
    ],
    ids=[
        "metrics-no-port",
        "metrics-port-too-big",
        "metrics-port-0",
        "last-0",
        "max-sweeps-past-the-most",
        "target-name",
        "unknown-flag",
    ],
)
def test_a_bad_argument_is_one_line_not_a_usage_block(
    config: Path, args: list[str], said: str
) -> None:
    line = one_line(
        run_main(*args, "--config", str(config), env=clean_env(TEMPORAL_ADDRESS=CLOSED))
    )

    assert said in line
    assert "--help" in line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--schedule", "nosuch"], "names no schedule 'nosuch'"),
        (["--target", "nosuch"], "names no target 'nosuch' (its targets: x_idempotency)"),
        (["--target", "x_idempotency", "--target", "x_idempotency"], "given twice"),
        (["--schedule", "hot", "--target", "x_idempotency"], "not both"),
    ],
    ids=["unknown-schedule", "unknown-target", "target-twice", "schedule-and-target"],
)
def test_a_sweep_that_cannot_be_a_pass_of_the_config_is_refused_before_temporal(
    config: Path, args: list[str], said: str
) -> None:
    done = run_main("sweep", "--config", str(config), *args, env=clean_env(TEMPORAL_ADDRESS=CLOSED))

    assert said in one_line(done)


@pytest.fixture
def pattern_config(tmp_path: Path) -> Path:
    """A config of one pattern target, `sessions` over `tenant_*.sessions`."""
    path = tmp_path / "purge.toml"
    path.write_text(
        '[[targets]]\nkind = "expiring"\nname = "sessions"\n'
        'table = "tenant_*.sessions"\ncolumn = "expires_at"\n',
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("targets", "said"),
    [
        (["sessions@other_1"], "'sessions@other_1' names no table the pattern 'sessions'"),
        (["sessions", "sessions@tenant_1"], "'sessions@tenant_1' is a table of 'sessions', which"),
        (["nosuch@tenant_1"], "names no target 'nosuch@tenant_1' (its targets: sessions)"),
    ],
    ids=["misfit-suffix", "pattern-and-its-table", "no-such-pattern"],
)
def test_a_pattern_s_table_by_hand_that_cannot_be_swept_is_refused_before_temporal(
    pattern_config: Path, targets: list[str], said: str
) -> None:
    args = [arg for name in targets for arg in ("--target", name)]
    done = run_main(
        "sweep", "--config", str(pattern_config), *args, env=clean_env(TEMPORAL_ADDRESS=CLOSED)
    )

    assert said in one_line(done)


@pytest.fixture
def pattern_and_python(pattern_config: Path) -> Path:
    """`pattern_config` with a python target beside its pattern."""
    with pattern_config.open("a", encoding="utf-8") as out:
        out.write(PYTHON_TARGET)
    return pattern_config


@pytest.mark.parametrize(
    ("targets", "said"),
    [
        (["sessions@other_1"], "'sessions@other_1' names no table the pattern 'sessions'"),
        (["sessions", "sessions@tenant_1"], "'sessions@tenant_1' is a table of 'sessions', which"),
    ],
    ids=["misfit-suffix", "pattern-and-its-table"],
)
def test_a_pattern_s_table_by_hand_is_checked_beside_a_python_target(
    pattern_and_python: Path, targets: list[str], said: str
) -> None:
    """A python target's factory may provide names the config does not list, but a name
    `sessions@...` is the pattern's table whatever else the config holds."""
    args = [arg for name in targets for arg in ("--target", name)]
    config = str(pattern_and_python)
    done = run_main("sweep", "--config", config, *args, env=clean_env(TEMPORAL_ADDRESS=CLOSED))

    assert said in one_line(done)


def test_a_name_the_config_does_not_list_is_left_to_a_python_target_s_factory(
    pattern_and_python: Path,
) -> None:
    """Not refused: only the worker, which builds the factory's targets, knows its names; the
    command gets as far as Temporal (not running here, status 1)."""
    done = run_main(
        "sweep", "--config", str(pattern_and_python), "--target", "from_the_factory",
        env=clean_env(TEMPORAL_ADDRESS=CLOSED),
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"pg-purge: cannot reach Temporal at {CLOSED}"), done.stderr


def test_report_tables_of_no_pattern_target_is_refused_before_temporal(
    pattern_config: Path,
) -> None:
    done = run_main(
        "report", "--config", str(pattern_config), "--tables", "session",
        env=clean_env(TEMPORAL_ADDRESS=CLOSED),
    )  # fmt: skip

    assert one_line(done) == (
        "pg-purge: report --tables: the config names no pattern target 'session' "
        "(its pattern targets: sessions)"
    )


#: A database's URL, as an operator might type it where another argument or setting goes.
URL = f"postgresql://purge:{SECRET}@db:5432/app"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["check", URL], "unrecognized arguments: <"),
        (["sweep", "--target", URL], "--target: not a target name: <"),
        (["run", "--metrics", URL], "--metrics: want HOST:PORT"),
        (["report", "--last", URL], "--last: want a whole number from 1 to 100,000, got <"),
        (["check", "host=db", f"password={SECRET}"], "unrecognized arguments: host=db <"),
        (["check", f"host=db password = {SECRET}"], "unrecognized arguments: host=db <"),
        (["check", f"host=db password='x {SECRET}'"], "unrecognized arguments: host=db <"),
        (["sweep", "--target", f"password='x {SECRET}'"], "--target: not a target name: <"),
    ],
    ids=["positional", "target", "metrics", "last", "keywords", "spaced", "quoted", "quoted-flag"],
)
def test_a_connection_string_typed_where_an_argument_goes_is_said_by_its_length(
    config: Path, args: list[str], said: str
) -> None:
    """`discover` takes a URL as its argument; typed so to another command, or to a flag,
    argparse's refusal quoted it whole on stderr. It is said by its length (`one_line` checks
    that the password is nowhere)."""
    line = one_line(
        run_main(*args, "--config", str(config), env=clean_env(TEMPORAL_ADDRESS=CLOSED))
    )

    assert said in line
    assert "characters not shown: may hold a password>" in line


@pytest.mark.parametrize("address", [URL, f"purge:{SECRET}@db:7233", f"db:7233?password={SECRET}"])
def test_a_database_url_given_as_temporals_address_is_said_by_its_length(
    config: Path, address: str
) -> None:
    line = one_line(
        run_main("schedule", "--config", str(config), env=clean_env(TEMPORAL_ADDRESS=address))
    )

    assert "Temporal address <" in line
    assert "characters not shown: may hold a password>" in line


@pytest.mark.parametrize("address", ["h:99999", "[::1", "http://127.0.0.1:1", "https://h:7233"])
def test_a_temporal_address_the_client_cannot_take_is_one_line(config: Path, address: str) -> None:
    """Among them an address with a scheme, which the SDK takes with a warning on stderr (and
    does not read `https` as TLS)."""
    done = run_main("schedule", "--config", str(config), env=clean_env(TEMPORAL_ADDRESS=address))

    assert f"Temporal address {address!r}" in one_line(done)


@pytest.mark.parametrize("command", ["schedule", "run"])
@pytest.mark.parametrize("address", ["nohost", "127.0.0.1", "nohost:", "[::1]", "h:99999", "h:0"])
def test_a_temporal_address_without_a_port_is_one_line(
    config: Path, command: str, address: str
) -> None:
    """The SDK would take it as port 80 and fail only when it connects, status 1; `run` says it
    before its database too (the database here is out of reach)."""
    env = clean_env(
        TEMPORAL_ADDRESS=address,
        PURGE_DATABASE_URL=f"postgresql://app:{SECRET}@127.0.0.1:1/app?connect_timeout=1",
    )
    done = run_main(command, "--config", str(config), env=env)

    line = one_line(done)
    assert f"Temporal address {address!r} (TEMPORAL_ADDRESS" in line
    assert "has no port from 1 to 65535: give HOST:PORT, like 'localhost:7233'" in line


def test_an_ipv6_temporal_address_with_a_port_is_taken(config: Path) -> None:
    """`[::1]:PORT` has its port after the brackets: the command gets as far as connecting."""
    done = run_main("schedule", "--config", str(config), env=clean_env(TEMPORAL_ADDRESS="[::1]:1"))

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("pg-purge: cannot reach Temporal at [::1]:1: "), done.stderr


def test_run_says_a_schemed_temporal_address_before_it_connects_to_the_database(
    config: Path,
) -> None:
    """`run` opens its database pools before it connects to Temporal: the address is read
    first, so a database out of reach does not hide it (a wait, then "cannot connect")."""
    env = clean_env(
        TEMPORAL_ADDRESS="http://127.0.0.1:7233",
        PURGE_DATABASE_URL=f"postgresql://app:{SECRET}@127.0.0.1:1/app?connect_timeout=1",
    )
    done = run_main("run", "--config", str(config), env=env)

    assert "Temporal address 'http://127.0.0.1:7233': give HOST:PORT" in one_line(done)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfe", "not a workflow history"),
        (b"", "not a workflow history"),
        (b"[]", "not a workflow history"),
        (b'{"events": 5}', "not a workflow history"),
        (None, "cannot read"),
    ],
    ids=["not-utf8", "empty", "a-list", "events-not-a-list", "missing"],
)
def test_a_history_file_that_is_no_history_is_one_line(
    tmp_path: Path, content: bytes | None, said: str
) -> None:
    path = tmp_path / "history.json"
    if content is not None:
        path.write_bytes(content)

    line = one_line(run_main("replay", str(path)))

    assert str(path) in line
    assert said in line


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deep"),
        ("x = " + "1" * 5000 + "\n", "a number too long"),
    ],
    ids=["nested-5000-deep", "5000-digit-integer"],
)
def test_a_file_past_the_toml_readers_limits_is_one_line(
    tmp_path: Path, text: str, said: str
) -> None:
    path = tmp_path / "purge.toml"
    path.write_text(text, encoding="utf-8")

    assert said in one_line(run_main("schema", "--config", str(path)))


def test_a_config_path_holding_a_newline_is_quoted(tmp_path: Path) -> None:
    path = tmp_path / "new\nline.toml"

    line = one_line(run_main("schema", "--config", str(path)))

    assert repr(str(path)) in line


def test_a_factory_that_exits_as_it_is_imported_is_refused_and_the_process_goes_on(
    tmp_path: Path,
) -> None:
    """A module that calls sys.exit() at its top (a script) is a bad factory, not the end of
    the command; what it printed as it was imported is not the command's output."""
    path = tmp_path / "purge.toml"
    path.write_text(
        '[[targets]]\nkind = "python"\nfactory = "tests.support.exits_on_import:targets"\n',
        encoding="utf-8",
    )

    line = one_line(run_main("schema", "--config", str(path)))

    assert "cannot import 'tests.support.exits_on_import': SystemExit: 2" in line


def test_a_presets_match_of_the_wrong_type_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "purge.toml"
    path.write_text(
        '[[targets]]\nkind = "procrastinate"\nmax_age = "1d"\nmatch = { status = { a = 1 } }\n',
        encoding="utf-8",
    )

    with pytest.raises(ConfigError, match=r"match\.status: only finished states") as refused:
        load_config(path, env={})
    assert "\n" not in str(refused.value)


def test_a_url_with_a_byte_that_is_no_character_is_refused_without_its_password(
    config: Path,
) -> None:
    """A byte of the environment that is no UTF-8 reaches Python as a surrogate, which libpq
    cannot be handed."""
    with pytest.raises(ConfigError, match="not a PostgreSQL connection string") as refused:
        load_config(config, env={"PURGE_DATABASE_URL": f"postgresql://u:{SECRET}@h/db\udcff"})
    assert SECRET not in str(refused.value)


def test_a_database_that_never_answers_at_start_is_one_line_with_libpqs_reason(
    tmp_path: Path,
) -> None:
    """Not bad input, but the same promise (docs/refusals-and-pacing.md): a worker whose
    database does not answer within `database_wait` exits 1 with one line, the URL masked and
    libpq's reason at its end; the pool's own two-line warning at each attempt is held back."""
    path = tmp_path / "purge.toml"
    path.write_text(
        f'database_url = "postgresql://app:{SECRET}@127.0.0.1:1/app?connect_timeout=1"\n'
        'database_wait = "1s"\n[[targets]]\nkind = "idempotency"\n',
        encoding="utf-8",
    )

    done = run_main("run", "--config", str(path), env=clean_env(TEMPORAL_ADDRESS=CLOSED))

    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pg-purge: cannot connect to postgresql://app:***@127.0.0.1:1/app")
    assert lines[0].endswith("Connection refused"), lines[0]
    assert SECRET not in done.stderr + done.stdout


def test_print_input_of_a_schedule_the_config_lacks_is_one_line(tmp_path: Path) -> None:
    one = tmp_path / "one.toml"
    one.write_text('[[targets]]\nkind = "idempotency"\n', encoding="utf-8")
    named = tmp_path / "named.toml"
    named.write_text(
        '[schedules.hot]\ncron = "*/5 * * * *"\ntargets = ["x_idempotency"]\n'
        '[[targets]]\nkind = "idempotency"\n',
        encoding="utf-8",
    )
    env = clean_env(TEMPORAL_ADDRESS=CLOSED)

    lacks = one_line(run_main("schedule", "--config", str(one), "--print-input", "hot", env=env))
    unnamed = one_line(run_main("schedule", "--config", str(named), "--print-input", env=env))

    assert lacks.endswith("the config has one [schedule], no 'hot': give no NAME")
    assert unnamed.endswith("name one of the config's schedules (hot)")


@pytest.mark.parametrize("args", [["schedule"], ["sweep"], ["run", "--schedule"], ["check"]])
def test_a_config_of_no_target_is_refused_where_its_passes_would_sweep_nothing(
    tmp_path: Path, args: list[str]
) -> None:
    """A config with no [[targets]]: a schedule of it would fire empty passes every hour; and
    `check` of it said nothing and exited 0."""
    empty = tmp_path / "purge.toml"
    empty.write_text(f'database_url = "postgresql://u:{SECRET}@127.0.0.1:1/db"\n', encoding="utf-8")

    line = one_line(run_main(*args, "--config", str(empty), env=clean_env(TEMPORAL_ADDRESS=CLOSED)))

    assert "purge.toml: names no target, so " in line
    said = "there is nothing to check" if args == ["check"] else "would sweep nothing"
    assert line.endswith(f"{said}; add [[targets]] (`pg-purge discover` suggests them)")


def test_a_malformed_temporal_config_file_is_one_line(tmp_path: Path, config: Path) -> None:
    """The SDK's TOML error quotes the line with a caret under it: the first line says it."""
    profile = tmp_path / "temporal.toml"
    profile.write_text("[profile.default]\naddress = \n", encoding="utf-8")
    env = clean_env(TEMPORAL_CONFIG_FILE=str(profile))

    line = one_line(run_main("schedule", "--config", str(config), env=env))

    assert line.startswith("pg-purge: config error: Temporal environment configuration: ")


def test_a_password_holding_an_unencoded_at_is_refused_without_a_piece_of_it(
    config: Path,
) -> None:
    """libpq would end the password at its first `@` and take the rest for a host, which its
    connection error then quotes."""
    env = clean_env(PURGE_DATABASE_URL=f"postgresql://app:{SECRET}@x@127.0.0.1:1/app")

    line = one_line(run_main("check", "--config", str(config), env=env))

    assert "an '@' in its user or password: write it %40" in line
    assert "x@127" not in line


def test_a_server_s_refusal_a_command_meets_is_one_line_with_status_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refusal met after a command connected (discover's catalog read past its
    statement_timeout, say) is one line, its first: never a traceback, nor a DETAIL."""
    import psycopg

    import worker

    async def refused(opts: object) -> int:
        raise psycopg.errors.QueryCanceled(
            "canceling statement due to statement timeout\nDETAIL:  Key (k)=(v)"
        )

    monkeypatch.setattr(worker, "_dispatch", refused)

    assert worker.main(["discover", "postgresql://app@127.0.0.1:1/app"]) == 1
    assert capsys.readouterr().err == (
        "pg-purge: the database refused: canceling statement due to statement timeout\n"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--config", URL],
        ["check", "--config", URL + "\n"],  # read from a secret's file: its newline kept
        ["check", "--config", f"host=db password={SECRET}"],
        ["replay", URL],
    ],
    ids=["config-url", "config-url-newline", "config-keywords", "replay-file"],
)
def test_a_connection_string_typed_where_a_file_goes_is_said_by_its_length(
    args: list[str],
) -> None:
    """`--config` (or $PURGE_CONFIG) and `replay`'s FILE name a file; a URL typed there was
    quoted whole as the file that does not exist, password and all."""
    line = one_line(run_main(*args, env=clean_env(TEMPORAL_ADDRESS=CLOSED)))

    assert "characters not shown: may hold a password>" in line


def test_a_file_path_that_only_begins_like_a_scheme_is_shown_as_given(tmp_path: Path) -> None:
    """`C:/cfg/purge.toml` (no user info, so no password) is named as typed, not hidden."""
    line = one_line(run_main("check", "--config", "C:/cfg/purge.toml", env=clean_env()))

    assert line == (
        "pg-purge: config error: C:/cfg/purge.toml: no such file; pass --config, set "
        "PURGE_CONFIG, or create ./purge.toml"
    )


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        (f'metrics = "{URL}"\n', "metrics: want HOST:PORT like '0.0.0.0:9464', got <"),
        (
            f'[[targets]]\nkind = "expiring"\nname = "t"\ntable = "{URL}"\ncolumn = "at"\n',
            "is not a table name",
        ),
        (f'[schedule]\nid = "{URL}"\n', "schedule.id"),
        (f'[schedule]\ntime_zone = "{URL}"\n', "time_zone"),
    ],
    ids=["metrics", "table", "schedule-id", "time-zone"],
)
def test_a_connection_string_pasted_into_any_config_key_is_said_by_its_length(
    tmp_path: Path, entry: str, said: str
) -> None:
    """Not only `database_url`, `url` and `task_queue`: every refusal of a config value quotes
    it through one mask, so a URL pasted into the wrong key is never repeated."""
    path = tmp_path / "purge.toml"
    path.write_text(entry + '[[targets]]\nkind = "idempotency"\n', encoding="utf-8")

    line = one_line(run_main("check", "--config", str(path), env=clean_env()))

    assert said in line
    assert "characters not shown: may hold a password>" in line

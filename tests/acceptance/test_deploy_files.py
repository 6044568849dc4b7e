"""The deployment files (deploy/) and the guide (docs/deploy.md) say what really works.

- every YAML file parses; every ``sasflow ...`` command line in the systemd
  units, the compose file and the Kubernetes manifests is accepted by the real
  command line (parsed and converted by click, nothing run);
- the Grafana dashboard and the Prometheus alerting rules parse, and every
  metric their expressions name is one that metrics.py defines;
- every role has its service, with probes; the schema upgrade runs before the
  workers; no URL (nor its password) is written on a command line;
- the manifests' ``sasflow healthcheck`` and ``sasflow db upgrade`` command lines,
  run as processes against the local PostgreSQL and RabbitMQ: 1 on a store
  without its schema, 0 once upgraded, non-zero when a server is unreachable;
- the systemd units' ExecStart commands, with their EnvironmentFiles (URLs
  pointed at the local servers), run as real processes under the two
  PostgreSQL roles the guide's GRANTs create: the upgrade as the owner, then a
  scheduler, three agents and a supervisor as the least-privileged role carry
  a submitted task to the end, and stop on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sasflow.cli import cli, run
from sasflow.cli.app_ref import AppRef, load_app
from sasflow.metrics import Metrics, store_exposition
from sasflow.store.records import Instance
from sasflow.worker import ROLES
from support.cli import SHOP
from support.process import Process

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
DASHBOARD = DEPLOY / "grafana" / "sasflow-dashboard.json"
ALERT_RULES = DEPLOY / "prometheus" / "sasflow-alerts.yml"
GUIDE = ROOT / "docs" / "deploy.md"
SHOP_AGENTS = ("inventory", "payments", "shipping")
SASFLOW = Path(sys.executable).parent / "sasflow"  # the installed console script
SERVER = "postgresql://postgres@127.0.0.1:5432/test"
AMQP = "amqp://guest:guest@127.0.0.1:5672/?queue_expires=60"
WAIT = 300.0  # seconds: a hang guard for each wait below, not a claim about speed
TERMINAL = ("processed", "error", "compensated", "cancelled")


# ---------------------------------------------------------------- reading the files
def yaml_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def compose() -> dict[str, Any]:
    return yaml_documents(COMPOSE)[0]


def k8s_objects() -> list[dict[str, Any]]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml_documents(p)]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def container_argv(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


@dataclass(frozen=True)
class Unit:
    path: Path
    entries: dict[str, list[str]]  # Key -> every value given (sections merged)

    @property
    def name(self) -> str:
        return self.path.name

    def one(self, key: str) -> str:
        values = self.entries.get(key, [])
        assert len(values) == 1, f"{self.name}: expected one {key}=, got {values}"
        return values[0]

    def words(self, key: str) -> list[str]:
        return [w for v in self.entries.get(key, []) for w in v.split()]


def read_unit(path: Path) -> Unit:
    entries: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not Key=Value: {line!r}"
        entries.setdefault(key.strip(), []).append(value.strip())
    return Unit(path, entries)


def units() -> dict[str, Unit]:
    return {p.name: read_unit(p) for p in sorted(SYSTEMD.glob("*.service"))}


WORKER_UNITS = ("sasflow-scheduler.service", "sasflow-agent@.service",
                "sasflow-supervisor.service")


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")):
            key, sep, value = line.partition("=")
            assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
            env[key] = value
    return env


def specifiers(unit: Unit, line: str, instance: str | None) -> str:
    """`line` with the specifiers systemd expands: %i and %I (the instance), %H, %%."""
    if instance is not None:
        line = line.replace("%i", instance).replace("%I", instance)
    line = line.replace("%H", socket.gethostname()).replace("%%", "%")
    assert "%" not in line, f"{unit.name}: a specifier this test does not expand: {line}"
    return line


def unit_environment(unit: Unit, local: dict[str, dict[str, str]],
                     instance: str | None = None) -> dict[str, str]:
    """The unit's EnvironmentFiles (the examples in deploy/systemd/) in order, then its
    Environment= lines (specifiers expanded); `local` replaces chosen values, per file,
    by the local servers'."""
    env: dict[str, str] = {}
    for entry in unit.entries.get("EnvironmentFile", []):
        name = Path(entry.removeprefix("-")).name
        example = SYSTEMD / name
        assert example.exists(), f"{unit.name} reads {entry}: no example {example}"
        values = read_env_file(example)
        replaced = local.get(name, {})
        missing = set(replaced) - set(values)
        assert not missing, f"{name} does not set {missing}"
        env.update(values)
        env.update(replaced)
    for line in unit.entries.get("Environment", []):
        for word in shlex.split(specifiers(unit, line, instance)):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def exec_start(unit: Unit, env: dict[str, str], instance: str | None = None) -> list[str]:
    """ExecStart as systemd expands it: %i, ${VAR} (one word) and $VAR (split)."""
    line = specifiers(unit, unit.one("ExecStart").lstrip("-@:+!"), instance)
    argv: list[str] = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            argv.extend(env[whole.group(1)].split())
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env[m.group(1)], word))
    return argv


def sasflow_command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv) of every `sasflow ...` command line in deploy/."""
    found: list[tuple[str, list[str]]] = []
    demo_env = read_env_file(SYSTEMD / "sasflow.env")
    demo = load_app(AppRef("sasflow.examples.orders.app", "app", is_path=False))
    for unit in units().values():
        instances = list(demo.agents) if unit.name.endswith("@.service") else [None]
        for instance in instances:
            env = unit_environment(unit, {}, instance) | demo_env
            found.append((f"{unit.name} ({instance})", exec_start(unit, env, instance)))
    for name, service in compose()["services"].items():
        command = service.get("command")
        if isinstance(command, list) and command and command[0] == "sasflow":
            found.append((f"compose {name}", command))
        test = service.get("healthcheck", {}).get("test")
        if test and test[0] == "CMD" and test[1] == "sasflow":
            found.append((f"compose {name} healthcheck", test[1:]))
    for obj in k8s_objects():
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        spec = pod_spec(obj)
        for container in spec.get("initContainers", []) + spec["containers"]:
            where = f"k8s {obj['metadata']['name']} {container['name']}"
            found.append((where, container_argv(container)))
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if probe in container:
                    found.append((f"{where} {probe}", container[probe]["exec"]["command"]))
    return found


# ---------------------------------------------------------------- the files themselves
def test_every_yaml_file_parses() -> None:
    """compose.yaml and every manifest: YAML, each document a mapping."""
    files = yaml_files()
    assert COMPOSE in files
    assert len([f for f in files if f.parent == K8S]) >= 5, files
    for path in files:
        documents = yaml_documents(path)
        assert documents, f"{path} is empty"
        for document in documents:
            assert isinstance(document, dict), f"{path}: {document!r}"
            assert path.parent != K8S or {"apiVersion", "kind", "metadata"} <= set(document), (
                path)


def defined_series() -> set[str]:
    """Every series name metrics.py may expose: a worker's and the store's families,
    with the suffixes of their types (a counter's _total, a histogram's _bucket...)."""
    instance = Instance(instance_id="w", host="h", pid=1, roles=[], agents=[], workflows={},
                        beat_at=0.0, lease=10.0)
    families = [*Metrics().registry.collect(),
                *text_string_to_metric_families(store_exposition({}, [instance], 0.0).decode())]
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count", "_created")}
    return {f"{family.name}{suffix}" for family in families for suffix in suffixes[family.type]}


def family_of(series: str) -> str:
    for suffix in ("_total", "_created", "_bucket", "_sum", "_count"):
        if series.endswith(suffix):
            return series.removesuffix(suffix)
    return series


def expressions(node: Any) -> Iterator[str]:
    """Every `expr` in a parsed JSON or YAML document, however deep."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def test_the_dashboard_and_the_alerting_rules_name_only_metrics_sasflow_defines() -> None:
    """Both parse; every `sasflow_...` name in their expressions is a series metrics.py
    exposes; the dashboard shows each family; each rule says how bad and what it means."""
    defined = defined_series()
    assert {"sasflow_tasks", "sasflow_step_duration_seconds_bucket",
            "sasflow_dead_letters_total"} <= defined
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    rules = yaml_documents(ALERT_RULES)[0]
    named: dict[str, set[str]] = {}
    for where, document in (("dashboard", dashboard), ("rules", rules)):
        found = list(expressions(document))
        assert found, where
        named[where] = {n for e in found for n in re.findall(r"\bsasflow_[a-z_]+", e)}
        assert named[where] <= defined, (where, named[where] - defined)
    assert {family_of(n) for n in named["dashboard"]} == {family_of(n) for n in defined}
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert len(alerts) >= 5
    for rule in alerts:
        assert rule["alert"].startswith("Sasflow") and rule["labels"]["severity"], rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule


def test_every_sasflow_command_line_is_accepted_by_the_real_cli(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command line goes through click's parsing and type conversion (exit 0,
    not the usage error's 2); a worker's APP loads and its --agents are declared."""
    for name in [k for k in os.environ if k.startswith("SASFLOW_")]:
        monkeypatch.delenv(name)  # only what is written in the files counts
    seen: list[tuple[str, dict[str, Any]]] = []

    def leaves(group: click.Group, path: str) -> Iterator[tuple[str, click.Command]]:
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from leaves(command, f"{path} {name}")
            else:
                yield f"{path} {name}", command

    for path, command in leaves(cli, "sasflow"):
        def record(*args: Any, _path: str = path, **kwargs: Any) -> None:
            seen.append((_path, kwargs))
        monkeypatch.setattr(command, "callback", record)

    lines = sasflow_command_lines()
    sources = {where.split()[0] for where, _ in lines}
    assert {"compose", "k8s"} <= sources and any(".service" in s for s in sources)
    for where, argv in lines:
        assert Path(argv[0]).name == "sasflow", f"{where}: {argv}"
        seen.clear()
        status = run(argv[1:])
        assert status == 0, f"{where}: `{shlex.join(argv)}` refused (exit {status})"
        assert len(seen) == 1, f"{where}: `{shlex.join(argv)}` ran no command"
        path, params = seen[0]
        if path == "sasflow worker":
            app = load_app(params["app_ref"])
            unknown = set(params["agents"] or ()) - set(app.agents)
            assert not unknown, f"{where}: agents {unknown} not declared by the app"


def test_every_role_has_its_service_with_probes_after_the_schema_upgrade() -> None:
    """systemd: a unit per role, each requiring and ordered after the one-shot upgrade;
    compose: each role waits for db-upgrade to exit 0, with a healthcheck;
    k8s: a Deployment per role with exec probes, requests and an init container that
    waits for the schema; a Job for the upgrade, applied and waited for first."""
    found = units()
    upgrade = found.pop("sasflow-db-upgrade.service")
    assert upgrade.one("Type") == "oneshot"
    assert exec_start(upgrade, {})[1:] == ["db", "upgrade"]
    assert sorted(found) == sorted(WORKER_UNITS)
    for unit in found.values():
        assert "sasflow-db-upgrade.service" in unit.words("Requires"), unit.name
        assert "sasflow-db-upgrade.service" in unit.words("After"), unit.name
        assert unit.one("EnvironmentFile") == "/etc/sasflow/sasflow.env"
    argvs = {u.name: exec_start(u, {"SASFLOW_APP": "m:app"}, "payments") for u in found.values()}
    for role in ROLES:
        (name,) = [n for n, argv in argvs.items() if argv[-2:] == ["--roles", role]
                   or ["--roles", role, "--agents", "payments"] == argv[-4:]]
        assert role in name

    services = compose()["services"]
    assert services["db-upgrade"]["command"] == ["sasflow", "db", "upgrade"]
    assert services["db-upgrade"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for role in ROLES:
        service = services[role]
        assert service["command"][-2:] == ["--roles", role]
        assert service["depends_on"]["db-upgrade"]["condition"] == (
            "service_completed_successfully")
        assert service["healthcheck"]["test"][1:3] == ["sasflow", "healthcheck"]

    objects = k8s_objects()
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    for role in ROLES:
        (deployment,) = [d for d in deployments
                         if container_argv(pod_spec(d)["containers"][0])[-2:] == ["--roles", role]]
        spec = pod_spec(deployment)
        for container in spec["containers"]:
            for probe in ("livenessProbe", "readinessProbe"):
                assert container[probe]["exec"]["command"][:2] == ["sasflow", "healthcheck"]
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert [container_argv(c)[:2] for c in spec["initContainers"]] == [
            ["sasflow", "healthcheck"]]
    (job,) = [o for o in objects if o["kind"] == "Job"]
    assert container_argv(pod_spec(job)["containers"][0]) == ["sasflow", "db", "upgrade"]
    # the guide applies the Job and waits for it before the Deployments
    guide = GUIDE.read_text(encoding="utf-8")
    waited = guide.index(f"kubectl wait --for=condition=complete job/{job['metadata']['name']}")
    for deployment in deployments:
        assert f"deploy/k8s/{deployment['metadata']['name'].removeprefix('sasflow-')}.yaml" in (
            guide[waited:]), deployment["metadata"]["name"]


def test_no_url_or_password_is_written_on_a_command_line() -> None:
    """URLs carry passwords: they reach sasflow through SASFLOW_STORE/SASFLOW_TRANSPORT."""
    for where, argv in sasflow_command_lines():
        assert not any("://" in word for word in argv), f"{where}: {argv}"
        assert "--store" not in argv and "--transport" not in argv, f"{where}: {argv}"


# ---------------------------------------------------------------- against the servers
def sasflow(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert Path(argv[0]).name == "sasflow"
    return subprocess.run([str(SASFLOW), *argv[1:]], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=WAIT)


def clean_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SASFLOW_", "PG"))}
    env.update(values)
    return env


@pytest.fixture
def private_schema(postgres_server: str, rabbitmq_server: str) -> Iterator[str]:
    name = f"deploy_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield name
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def schema_url(schema: str, user: str = "postgres", port: int = 5432) -> str:
    return f"postgresql://{user}@127.0.0.1:{port}/test?options=-csearch_path%3D{schema}"


def test_manifest_healthchecks_and_upgrade_on_postgres_and_rabbitmq(
        private_schema: str, tmp_path: Path) -> None:
    """The probes' command lines as processes: 1 before `db upgrade` (so the init
    containers wait for the Job), 0 after it (the workers' probes: once a worker named
    as they name it beats), non-zero when either server is down, and the workers'
    probes 1 once that worker has stopped."""
    lines = sasflow_command_lines()
    checks = {tuple(argv) for _, argv in lines if argv[1] == "healthcheck"}
    upgrades = {tuple(argv) for where, argv in lines
                if argv[1:3] == ["db", "upgrade"] and not where.endswith(")")}
    assert checks and upgrades
    store = schema_url(private_schema)
    up = clean_env(SASFLOW_STORE=store, SASFLOW_TRANSPORT=AMQP)
    for check in sorted(checks):
        before = sasflow(list(check), up, tmp_path)
        assert before.returncode == 1, (check, before.stdout, before.stderr)
        assert "sasflow db upgrade" in before.stderr
    for upgrade in sorted(upgrades):  # the Job's and compose's: twice is harmless
        done = sasflow(list(upgrade), up, tmp_path)
        assert done.returncode == 0, (upgrade, done.stderr)
    beating = sorted(c for c in checks if "--instance-id" in c)
    assert beating, "the workers' probes check their own worker's heartbeat"
    # a worker named as the containers name theirs (a supervisor: it consumes no queue)
    worker = unit_process("probed", [str(SASFLOW), "worker", SHOP, "--roles", "supervisor",
                                     "--instance-id", "{host}"], up, tmp_path)
    try:
        deadline = time.monotonic() + WAIT
        while (first := sasflow(list(beating[0]), up, tmp_path)).returncode != 0:
            assert worker.popen.poll() is None, worker.text()
            assert time.monotonic() < deadline, (first.stderr, worker.text())
            time.sleep(0.2)
        for check in sorted(checks):
            healthy = sasflow(list(check), up, tmp_path)
            assert (healthy.returncode, healthy.stdout.strip()) == (0, "ok"), (
                check, healthy.stderr)
            for down in (clean_env(SASFLOW_STORE=schema_url(private_schema, port=1),
                                   SASFLOW_TRANSPORT=AMQP),
                         clean_env(SASFLOW_STORE=store,
                                   SASFLOW_TRANSPORT="amqp://guest:guest@127.0.0.1:1/")):
                failed = sasflow(list(check), down, tmp_path)
                assert failed.returncode != 0, (check, down, failed.stdout)
                assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    finally:
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.popen.wait(timeout=WAIT) == 0, worker.text()
    for check in beating:
        stopped = sasflow(list(check), up, tmp_path)
        assert stopped.returncode == 1 and "stopped" in stopped.stderr, stopped.stderr
        assert len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr


def guide_grants(owner: str, app: str, schema: str) -> str:
    """The guide's SQL block that creates the roles and grants, for these names."""
    guide = GUIDE.read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```sql\n(.*?)```", guide, re.S)
              if "ALTER DEFAULT PRIVILEGES" in b]
    assert len(blocks) == 1, "the guide has one SQL block with the grants"
    sql = re.sub(r"\bsasflow_owner\b", owner, blocks[0])
    sql = re.sub(r"\bsasflow_app\b", app, sql)
    sql = re.sub(r"\bsasflow\b", schema, sql)
    assert "sasflow" not in sql.replace(owner, "").replace(app, "").replace(schema, ""), sql
    return sql


@pytest.fixture
def guide_roles(postgres_server: str, rabbitmq_server: str) -> Iterator[tuple[str, str, str]]:
    """The owner and the workers' roles, and their schema, made by the guide's SQL."""
    tag = f"deploy_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    owner, app, schema = f"{tag}_owner", f"{tag}_app", tag
    with psycopg.connect(SERVER, autocommit=True) as conn:
        for (old,) in conn.execute("SELECT rolname FROM pg_roles"
                                   " WHERE rolname ~ '^deploy_[0-9]+_'").fetchall():
            if not os.path.exists(f"/proc/{old.split('_')[1]}"):  # its run is gone
                conn.execute(f"DROP SCHEMA IF EXISTS {old.rsplit('_', 1)[0]} CASCADE")
                conn.execute(f"DROP OWNED BY {old}")
                conn.execute(f"DROP ROLE {old}")
        try:
            # the guide's first block, less the database (the tests use `test`)
            conn.execute(f"CREATE ROLE {owner} LOGIN")
            conn.execute(f"CREATE ROLE {app} LOGIN")
            conn.execute(guide_grants(owner, app, schema).encode())
            yield owner, app, schema
        finally:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            for role in (app, owner):
                exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                      (role,)).fetchone()
                if exists:
                    conn.execute(f"DROP OWNED BY {role}")
                    conn.execute(f"DROP ROLE {role}")


def unit_process(name: str, argv: list[str], env: dict[str, str], cwd: Path) -> Process:
    """One unit's ExecStart as a process (this install's `sasflow`), its output in a file."""
    return Process.spawn(name, [str(SASFLOW), *argv[1:]], cwd / f"{name}.log", env=env, cwd=cwd)


def test_systemd_units_run_a_task_on_postgres_and_rabbitmq_with_the_guides_grants(
        guide_roles: tuple[str, str, str], tmp_path: Path) -> None:
    owner, app_role, schema = guide_roles
    local = {"sasflow.env": {"SASFLOW_APP": SHOP, "SASFLOW_STORE": schema_url(schema, app_role),
                             "SASFLOW_TRANSPORT": AMQP},
             "db-upgrade.env": {"SASFLOW_STORE": schema_url(schema, owner)}}
    found = units()
    deadline = time.monotonic() + WAIT

    upgrade = found["sasflow-db-upgrade.service"]
    env = unit_environment(upgrade, local)
    assert env["SASFLOW_STORE"] == local["db-upgrade.env"]["SASFLOW_STORE"]
    done = sasflow(exec_start(upgrade, env), clean_env(**env), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("applied "), done.stdout  # a fresh schema

    processes: list[Process] = []
    try:
        for name in WORKER_UNITS:
            unit = found[name]
            for instance in SHOP_AGENTS if name.endswith("@.service") else (None,):
                env = unit_environment(unit, local, instance)
                assert env["SASFLOW_STORE"] == local["sasflow.env"]["SASFLOW_STORE"]
                label = name.replace("@", f"@{instance}") if instance else name
                processes.append(unit_process(label, exec_start(unit, env, instance),
                                              clean_env(**env), tmp_path))
        for process in processes:
            process.wait_for_line("starting", timeout=max(deadline - time.monotonic(), 0.0))

        worker_env = clean_env(**unit_environment(found["sasflow-scheduler.service"], local))
        task_id = f"deploy-{uuid.uuid4().hex[:8]}"
        submitted = sasflow(["sasflow", "submit", SHOP, "order", "--input", '{"order": 1}',
                             "--task-id", task_id], worker_env, tmp_path)
        assert (submitted.returncode, submitted.stdout.strip()) == (0, task_id), submitted.stderr
        # each wait its own guard: five processes starting on a loaded machine may have
        # used most of the first
        deadline = time.monotonic() + WAIT
        while True:
            shown = sasflow(["sasflow", "tasks", "show", task_id, "--json"], worker_env, tmp_path)
            assert shown.returncode == 0, shown.stderr
            task = yaml.safe_load(shown.stdout)  # JSON is YAML
            if task["state"] in TERMINAL:
                break
            assert time.monotonic() < deadline, (task, [p.text() for p in processes])
            time.sleep(0.1)
        # a task ended otherwise says so at once, not after the hang guard
        assert task["state"] == "processed", (task, [p.text() for p in processes])
        assert [(s["name"], s["state"]) for s in task["steps"]] == [
            ("reserve", "completed"), ("charge", "completed"), ("ship", "completed")]

        for process in processes:
            process.popen.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                status = process.popen.wait(timeout=max(deadline - time.monotonic(), 30.0))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{process.name} did not stop on SIGTERM: {process.text()}")
            assert status == 0, f"{process.name} exited {status}: {process.text()}"
            assert "stopped" in process.text(), process.text()
    finally:
        for process in processes:
            process.kill()

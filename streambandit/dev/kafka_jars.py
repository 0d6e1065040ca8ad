"""Apache Kafka's broker as jars from Maven Central, pinned by ``kafka-jars.lock`` beside this file.

The lock names every jar the broker runs with (its coordinates and SHA-256), so a fresh machine
gets the same broker: Maven fetches exactly those artifacts, none of their dependencies, and each
file is checked against the lock before it is used. The jars are kept in a cache directory
(``$STREAMBANDIT_KAFKA_CACHE``, else ``$XDG_CACHE_HOME/streambandit/kafka`` or
``~/.cache/streambandit/kafka``), one folder per Kafka version; only the first start needs Maven.

``python -m streambandit.dev.kafka_jars relock VERSION`` resolves a Kafka version's broker
transitively and rewrites the lock (a maintainer's step, then committed).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from streambandit.dev.tansu import BrokerError

__all__ = [
    "LOCK_PATH",
    "JavaToolMissing",
    "Jar",
    "JarLock",
    "parse_lock",
    "format_lock",
    "cache_root",
    "java_binary",
    "is_cached",
    "check_prerequisites",
    "classpath",
    "relock",
]

LOCK_PATH = Path(__file__).with_name("kafka-jars.lock")
# Kafka 4's broker is compiled for Java 17.
MIN_JAVA = 17
# Pinned rather than left to Maven's prefix resolution, which would take whatever is newest.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
# The broker logs through SLF4J 1.x; without a binding to log4j 2 its log lines go nowhere, and a
# broker that fails to start would leave no reason behind. Kafka's own distribution ships it too.
LOG_BINDING = ("org.apache.logging.log4j", "log4j-slf4j-impl")
KAFKA = ("org.apache.kafka", "kafka_2.13")


class JavaToolMissing(BrokerError):
    """java (or, until the jars are cached, mvn) is missing or too old to run Apache Kafka."""


@dataclass(frozen=True)
class Jar:
    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        """The name maven-dependency-plugin's copy gives it with ``mdep.prependGroupId``."""
        return f"{self.group}.{self.artifact}-{self.version}.jar"


@dataclass(frozen=True)
class JarLock:
    jars: tuple[Jar, ...]
    digest: str  # of the lock's text: a cached copy made from another lock is not reused

    @property
    def kafka_version(self) -> str:
        return next(j.version for j in self.jars if (j.group, j.artifact) == KAFKA)


_LINE = re.compile(r"^([\w.\-]+):([\w.\-]+):([\w.\-]+)\s+([0-9a-f]{64})$")


def parse_lock(text: str, source: str = "the Kafka jar lock") -> JarLock:
    """``group:artifact:version sha256`` a line; ``#`` starts a comment."""
    jars = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if m is None:
            raise BrokerError(
                f"{source}, line {number}: expected 'group:artifact:version sha256', got {line!r}"
            )
        jars.append(Jar(*m.groups()))
    names = [(j.group, j.artifact) for j in jars]
    if len(set(names)) != len(names):
        dup = sorted({f"{g}:{a}" for g, a in names if names.count((g, a)) > 1})
        raise BrokerError(f"{source} names {', '.join(dup)} more than once")
    if KAFKA not in names:
        raise BrokerError(f"{source} has no {':'.join(KAFKA)} line")
    return JarLock(tuple(jars), hashlib.sha256(text.encode()).hexdigest())


def format_lock(jars: list[Jar], header: str) -> str:
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    lines += [
        f"{j.coordinates} {j.sha256}" for j in sorted(jars, key=lambda j: (j.group, j.artifact))
    ]
    return "\n".join(lines) + "\n"


def read_lock(path: Path = LOCK_PATH) -> JarLock:
    try:
        text = path.read_text()
    except OSError as exc:
        raise BrokerError(f"cannot read the Kafka jar lock {path}: {exc.strerror}") from None
    return parse_lock(text, source=str(path))


def cache_root() -> Path:
    configured = os.environ.get("STREAMBANDIT_KAFKA_CACHE")
    if configured:
        return Path(configured)
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(home) / "streambandit" / "kafka"


def java_binary() -> str:
    """The java that runs the broker: $JAVA_HOME's, as Kafka's own scripts take, else the one on
    PATH; checked to be Java 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    java = (
        os.path.join(home, "bin", "java")
        if home and os.path.isfile(os.path.join(home, "bin", "java"))
        else shutil.which("java")
    )
    if java is None:
        raise JavaToolMissing(
            f"Apache Kafka needs Java {MIN_JAVA} or newer and there is no java on PATH "
            "(Debian: apt-get install default-jre-headless)"
        )
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaToolMissing(f"{java} -version failed: {exc}") from None
    major = java_major(out)
    if major is None or major < MIN_JAVA:
        seen = out.strip().splitlines()[0] if out.strip() else "no version"
        raise JavaToolMissing(
            f"Apache Kafka needs Java {MIN_JAVA} or newer; {java} is {seen!r} "
            "(set JAVA_HOME to a newer one)"
        )
    return java


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version``'s output: "17.0.15" -> 17, "1.8.0_412" -> 8."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def is_cached(lock: JarLock | None = None, cache: Path | None = None) -> bool:
    """Whether the locked jars are in the cache (a start then needs no Maven)."""
    lock = lock or read_lock()
    jars = (cache or cache_root()) / lock.kafka_version / "jars"
    try:
        return (jars / ".lock-sha256").read_text() == lock.digest and all(
            (jars / j.file_name).is_file() for j in lock.jars
        )
    except OSError:
        return False


def check_prerequisites(lock: JarLock | None = None, cache: Path | None = None) -> None:
    """Raise :class:`JavaToolMissing` unless this machine can run the locked broker: Java 17+,
    and mvn unless the jars are already in the cache."""
    java_binary()
    if not is_cached(lock, cache):
        _mvn()


def _mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JavaToolMissing(
            "Apache Kafka's jars are fetched with Maven the first time, and there is no mvn on PATH "
            "(Debian: apt-get install maven)"
        )
    return mvn


def _pom(deps: list[tuple[str, str, str]], transitive: bool) -> str:
    # Every locked jar is a direct dependency with its own dependencies excluded: Maven then
    # fetches exactly the lock's list, whatever newer versions a range would pick today.
    exclude = (
        ""
        if transitive
        else "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId>"
        "</exclusion></exclusions>"
    )
    body = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>{exclude}"
        f"</dependency>"
        for g, a, v in deps
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n  <modelVersion>4.0.0</modelVersion>\n'
        "  <groupId>streambandit.dev</groupId><artifactId>kafka-broker</artifactId><version>0</version>"
        "<packaging>pom</packaging>\n"
        f"  <dependencies>\n{body}\n  </dependencies>\n</project>\n"
    )


def _run_maven(workdir: Path, goal: str, *props: str) -> None:
    cmd = [
        _mvn(),
        "-B",
        "-q",
        "-f",
        str(workdir / "pom.xml"),
        f"{DEPENDENCY_PLUGIN}:{goal}",
        *props,
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise BrokerError(
            "Maven took longer than 15 minutes to fetch Apache Kafka's jars"
        ) from None
    if done.returncode != 0:
        out = (done.stdout + done.stderr).splitlines()
        errors = [
            ln.removeprefix("[ERROR]").strip()
            for ln in out
            if ln.startswith("[ERROR]") and ln[7:].strip()
        ]
        reason = errors[0] if errors else (out[-1] if out else f"exit code {done.returncode}")
        raise BrokerError(
            f"Maven could not fetch Apache Kafka's jars (is Maven Central reachable?): {reason}"
        )


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def classpath(lock: JarLock | None = None, cache: Path | None = None) -> list[Path]:
    """The locked jars in the cache, fetched with Maven and checked against the lock the first
    time (under a file lock: two test runs starting at once fetch once)."""
    lock = lock or read_lock()
    home = (cache or cache_root()) / lock.kafka_version
    jars_dir = home / "jars"
    paths = [jars_dir / j.file_name for j in lock.jars]
    if is_cached(lock, cache):
        return paths
    try:
        home.mkdir(parents=True, exist_ok=True)
        guard = open(home / ".resolving", "w")
    except OSError as exc:
        raise BrokerError(
            f"cannot write the Kafka jar cache {home}: {exc.strerror} "
            "(set STREAMBANDIT_KAFKA_CACHE to a writable directory)"
        ) from None
    with guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if is_cached(lock, cache):
            return paths
        work = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
        try:
            (work / "pom.xml").write_text(
                _pom([(j.group, j.artifact, j.version) for j in lock.jars], transitive=False)
            )
            out = work / "jars"
            _run_maven(
                work,
                "copy-dependencies",
                f"-DoutputDirectory={out}",
                "-Dmdep.prependGroupId=true",
                "-DincludeScope=runtime",
            )
            for jar in lock.jars:
                got = out / jar.file_name
                if not got.is_file():
                    raise BrokerError(
                        f"Maven did not deliver {jar.coordinates} (expected {got.name})"
                    )
                digest = sha256_of(got)
                if digest != jar.sha256:
                    raise BrokerError(
                        f"{jar.coordinates} from Maven has SHA-256 {digest}, the lock says {jar.sha256}: "
                        "refusing to run it"
                    )
            (out / ".lock-sha256").write_text(lock.digest)
            if jars_dir.exists():
                shutil.rmtree(jars_dir)
            os.replace(
                out, jars_dir
            )  # whole or not at all: an interrupted fetch is never taken as done
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return paths


def _resolve_transitively(
    work: Path, roots: list[tuple[str, str, str]]
) -> dict[tuple[str, str], tuple[str, Path]]:
    (work / "pom.xml").write_text(_pom(roots, transitive=True))
    listing = work / "list.txt"
    _run_maven(
        work,
        "list",
        f"-DoutputFile={listing}",
        "-DoutputAbsoluteArtifactFilename=true",
        "-DincludeScope=runtime",
    )
    found = {}
    for line in listing.read_text().splitlines():
        fields = line.split(" -- ", 1)[0].strip().split(":")
        if len(fields) != 6:  # group:artifact:type:version:scope:path; headers and blanks
            continue
        group, artifact, kind, version, _scope, path = fields
        if kind != "jar":
            raise BrokerError(
                f"{group}:{artifact} resolved as a {kind}, which the lock cannot name"
            )
        found[(group, artifact)] = (version, Path(path))
    return found


def relock(version: str, path: Path = LOCK_PATH) -> JarLock:
    """Resolve Kafka ``version``'s broker (and the log binding at its log4j's version) and write
    the lock."""
    with tempfile.TemporaryDirectory(prefix="kafka-relock-") as tmp:
        work = Path(tmp)
        found = _resolve_transitively(work, [(*KAFKA, version)])
        log4j = found.get(("org.apache.logging.log4j", "log4j-api"))
        if log4j is None:
            raise BrokerError(
                f"Kafka {version}'s broker brings no log4j-api: the log binding needs another choice"
            )
        found = _resolve_transitively(work, [(*KAFKA, version), (*LOG_BINDING, log4j[0])])
        jars = [Jar(g, a, v, sha256_of(p)) for (g, a), (v, p) in found.items()]
    header = (
        f"Apache Kafka {version}'s broker (org.apache.kafka:kafka_2.13 and what it needs at run time, with\n"
        f"{':'.join(LOG_BINDING)} for its log lines), from Maven Central: group:artifact:version sha256.\n"
        f"Written by `python -m streambandit.dev.kafka_jars relock {version}`; streambandit/dev/kafka_jars.py\n"
        "fetches exactly these jars and refuses any whose SHA-256 differs."
    )
    text = format_lock(jars, header)
    path.write_text(text)
    return parse_lock(text, source=str(path))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "relock":
        sys.exit("usage: python -m streambandit.dev.kafka_jars relock KAFKA_VERSION")
    try:
        written = relock(sys.argv[2])
    except BrokerError as exc:
        sys.exit(f"relock: {exc}")
    print(f"{LOCK_PATH}: Kafka {written.kafka_version}, {len(written.jars)} jars")

"""The Avro schemas that the documentation and the code's docstrings name are files that exist:
a path is the repository's, a bare name one of streambandit.wire.schemas.SCHEMA_DIR."""

import re
from pathlib import Path

from streambandit.wire.schemas import SCHEMA_DIR

ROOT = Path(__file__).resolve().parents[3]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "streambandit").rglob("*.py")),  # docstrings and comments
]
MENTION = re.compile(r"[\w./*-]*\.avsc")


def test_every_avro_schema_the_docs_name_exists():
    named = 0
    for doc in DOCS:
        for mention in MENTION.findall(doc.read_text()):
            if mention in ("*.avsc", ".avsc"):  # the extension itself
                continue
            named += 1
            where = ROOT if "/" in mention else SCHEMA_DIR
            assert list(where.glob(mention)), f"{doc.relative_to(ROOT)} names {mention}"
    assert named >= 5  # the replay format's schema and the record schemas of docs/schemas.md
    replay_formats = (ROOT / "docs" / "replay_formats.md").read_text()
    assert "streambandit/wire/schemas/logged_decision.avsc" in replay_formats

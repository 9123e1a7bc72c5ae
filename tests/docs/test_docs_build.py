"""The documentation site builds strict (every warning an error) and its API reference is complete."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import celery_dlq

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_docs_build_strict_offline_and_the_api_page_lists_every_public_name(tmp_path):
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                            str(DOCS), str(tmp_path / "html")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    api = (tmp_path / "html" / "api.html").read_text()
    missing = [name for name in celery_dlq.__all__ if f'id="celery_dlq.{name}"' not in api]
    assert missing == []
    for page in sorted(DOCS.glob("*.md")):
        assert (tmp_path / "html" / f"{page.stem}.html").exists(), f"{page.name} is not in the site"


def test_every_page_has_one_title():
    for page in sorted(DOCS.glob("*.md")):
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        titles = re.findall(r"^# ", text, flags=re.M)
        assert len(titles) == 1, f"{page.name}: {len(titles)} top-level titles"


def test_the_readme_is_a_front_page_naming_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 260
    assert "scripts/demo.sh" in readme and "scripts/test.sh" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_every_setting_is_in_the_settings_reference():
    from celery_dlq.settings import DEFAULTS

    reference = (DOCS / "reference.md").read_text()
    assert [name for name in DEFAULTS if f"`{name}`" not in reference] == []

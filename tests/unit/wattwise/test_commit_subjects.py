"""The commit-subject rule (issue 70 item 2): the commit-msg hook and CI's check of the commits
after a fixed base, also from a shallow clone."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / ".ci" / "commit_subjects.py"
HOOK = ROOT / ".githooks" / "commit-msg"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("commit_subjects", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_subject_rules() -> None:
    check = load().subject_problems
    assert check("Add the hook\n\nWhy: long subjects.\n") == []
    assert check("x" * 72) == []
    assert check("x" * 73)
    assert check("Add the hook\nno blank line before the body\n")
    assert check("# a comment git strips\n\nAdd the hook\n") == []
    verbose = "Add it\n\n# ------------------------ >8 ------------------------\n" + "y" * 100
    assert check(verbose) == []


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["python3", str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False)


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_ci_checks_the_commits_after_the_base_also_when_shallow(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "commit", "-q", "--allow-empty", "-m", "An old subject " + "long " * 30)
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "--allow-empty", "-m", "Add a short subject", "-m", "The body.")
    ok = run(repo, "--base", base)
    assert ok.returncode == 0, ok.stderr
    assert "1 checked, 0 problems" in ok.stdout
    git(repo, "commit", "-q", "--allow-empty", "-m", "A new subject " + "long " * 20)
    bad = run(repo, "--base", base)
    assert bad.returncode == 1 and "subject is" in bad.stderr

    # A shallow clone fetches the rest of the history from its remote, then checks as above.
    fetched = tmp_path / "fetched"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(fetched))
    unshallowed = run(fetched, "--base", base)
    assert unshallowed.returncode == 1 and "2 checked, 1 problems" in unshallowed.stdout

    # A shallow clone without the base and no way to fetch it: HEAD's own commit alone.
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    git(shallow, "remote", "set-url", "origin", str(tmp_path / "nowhere"))
    still_bad = run(shallow, "--base", base)
    assert still_bad.returncode == 1 and "checked HEAD alone" in still_bad.stderr
    git(shallow, "commit", "-q", "--allow-empty", "-m", "Fix it")
    fine = run(shallow, "--base", base)
    assert fine.returncode == 0, fine.stderr


def test_the_hook_runs_the_same_check(tmp_path: Path) -> None:
    assert os.access(HOOK, os.X_OK)
    assert ".ci/commit_subjects.py" in HOOK.read_text(encoding="utf-8")
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("z" * 80 + "\n", encoding="utf-8")
    refused = subprocess.run([str(HOOK), str(message)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "at most 72" in refused.stderr
    message.write_text("Keep it short\n", encoding="utf-8")
    assert subprocess.run([str(HOOK), str(message)], cwd=ROOT, check=False).returncode == 0

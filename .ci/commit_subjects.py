#!/usr/bin/env python3
"""Commit subjects of at most 72 characters (issue 70 item 2), so `git log --oneline` fits 80
columns. A subject is the message's first line: the imperative, then a blank line, then the
body with the why and the numbers.

  python3 .ci/commit_subjects.py --message-file FILE   # the commit-msg hook (.githooks/)
  python3 .ci/commit_subjects.py                        # CI: the commits after BASE (below)

Standard library only: the hook runs before any virtualenv exists.
"""

import argparse
import os
import subprocess
import sys

LIMIT = 72
SCISSORS = "# ------------------------ >8 ------------------------"

# CI checks the commits reachable from HEAD and not from BASE, merged branches' commits included.
# BASE is main's head when the rule came in (issue 70): the history before it has subjects of
# hundreds of characters, which no check can change now. A fixed commit rather than a
# merge-base: CI builds a clean checkout of main, which has no other branch to take a
# merge-base with, and a fixed commit stays an ancestor of every later main whether branches
# are merged or rebased onto it.
BASE = "0fab8043ae50124c431417a69faa6610e12c1149"


def subject_problems(message: str) -> list[str]:
    """What is wrong with a commit message's subject; none if it is fine."""
    message = message.split(SCISSORS)[0]  # `git commit -v`: the diff below is not the message
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return []  # git itself refuses an empty message
    subject = lines[0].rstrip()
    problems = []
    if len(subject) > LIMIT:
        problems.append(f"subject is {len(subject)} characters (at most {LIMIT}): {subject[:LIMIT]}...")
    if len(lines) > 1 and lines[1].strip():
        problems.append("the subject is one line: leave a blank line before the body")
    return problems


def git(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # never wait on a password prompt
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False,
                              env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["git", *args], 124, "", "timed out")
    except FileNotFoundError:
        return subprocess.CompletedProcess(["git", *args], 127, "", "git is not installed")


def has_commit(rev: str) -> bool:
    return git("cat-file", "-e", f"{rev}^{{commit}}").returncode == 0


def commits_to_check(base: str) -> tuple[list[str], str]:
    """The commits after `base`, and a note when the history could not show them all."""
    if not has_commit(base) and git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        # A shallow clone (CI's checkout may be one): fetch the rest if the remote answers.
        git("fetch", "--quiet", "--unshallow", timeout_s=300)
    if has_commit(base):
        listed = git("rev-list", f"{base}..HEAD")
        return listed.stdout.split(), ""
    # Still no BASE (no remote, or a copy without history): the commits shown may reach back past
    # BASE, whose subjects predate the rule, so only HEAD's own commit is checked.
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return [], "no git history here: nothing checked"
    return [head.stdout.strip()], f"{base[:12]} is not in this clone's history: checked HEAD alone"


def check_range(base: str) -> int:
    commits, note = commits_to_check(base)
    if note:
        print(f"commit subjects: {note}", file=sys.stderr)
    failures = []
    for commit in commits:
        message = git("log", "-1", "--format=%B", commit).stdout
        failures += [f"{commit[:12]}: {problem}" for problem in subject_problems(message)]
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"commit subjects: {len(commits)} checked, {len(failures)} problems")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--message-file", help="check this commit message (the commit-msg hook)")
    parser.add_argument("--base", default=BASE, help="check the commits after this one (default: %(default)s)")
    args = parser.parse_args()
    if args.message_file:
        with open(args.message_file, encoding="utf-8") as f:
            problems = subject_problems(f.read())
        for problem in problems:
            print(f"commit-msg: {problem}", file=sys.stderr)
        return 1 if problems else 0
    return check_range(args.base)


if __name__ == "__main__":
    sys.exit(main())

"""The on-disk index's merge on a disk that fills inside the merged list file (issue 50, case 5): Faiss wrote
the list file through a memory map of a sparse file, and the process died of SIGBUS. Now its blocks are
allocated first: one line naming lists.ivfdata, the filled parts kept, an index already in --out untouched."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # commands run in a private mount namespace on a small tmpfs


def _one_line(rc: int, err: str, *needles: str) -> None:
    assert rc == 2, (rc, err[-2000:])
    lines = [line for line in err.splitlines() if line.startswith("cramkit: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_merge_on_a_full_disk_is_one_line_and_keeps_the_index(pretrained_run, tmp_path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs")
    disk, logs = tmp_path / "disk", tmp_path / "logs"
    disk.mkdir()
    logs.mkdir()
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", str(disk)], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here ({probe.stderr.decode().strip()})")
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(f"line {i} about topic {i % 7} and more words" for i in range(2000)) + "\n")
    ck = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "cramkit"])
    build = f"{ck} index build {docs} --encoder {pretrained_run} --on-disk --device cpu --chunk-tokens 16 --overlap 0"

    def run(name: str, cmd: str) -> str:
        return f"{cmd} >{logs}/{name}.out 2>{logs}/{name}.err; echo $? >{logs}/{name}.rc"

    free = f"$(df -k --output=avail {disk} | tail -1)"
    # F1 - F0: what a build writes before its merge (shard 0 of 2 prepares and fills one part of two); less the
    # encoder copy, which a rebuild over an index keeps. The disk is then filled to leave that, the other part
    # and half the list file: the merge's list file is where it fills.
    script = "\n".join(
        [
            "set -u",
            f"mount -t tmpfs -o size=16384k tmpfs {disk}",
            run("old", f"{build} --out {disk}/old"),
            f"cp {disk}/old/index.json {logs}/old.json",
            f"F0={free}",
            run("shard0", f"{build} --out {disk}/new --shard 0/2"),
            f"F1={free}",
            f"P=$(stat -c %s {disk}/new/.build/ondisk/part-00000-of-00002.index)",
            f"L=$(stat -c %s {disk}/old/data-000/lists.ivfdata)",
            f"head -c $(( F1 * 1024 - P - 8192 - L / 2 )) /dev/zero > {disk}/filler",
            run("shard1", f"{build} --out {disk}/new --shard 1/2"),
            f"ls {disk}/new {disk}/new/.build/ondisk > {logs}/new.ls",
            f"rm {disk}/filler",
            f"E=$(du -sk {disk}/new/encoder | cut -f1)",
            f"rm -r {disk}/new",
            f"F2={free}",
            f"head -c $(( (F2 - (F0 - F1 - E)) * 1024 - P - 8192 - L / 2 )) /dev/zero > {disk}/filler",
            run("over", f"{build} --out {disk}/old --overwrite"),
            run("query", f"{ck} index query {disk}/old 'topic 3' -k 1 --json"),
            f"cp {disk}/old/index.json {logs}/after.json",
            f"rm {disk}/filler",
            run("again", f"{build} --out {disk}/old --overwrite"),
        ]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr

    def result(name: str) -> tuple[int, str]:
        return int((logs / f"{name}.rc").read_text()), (logs / f"{name}.err").read_text()

    for name in ("old", "shard0"):
        assert result(name)[0] == 0, result(name)[1][-2000:]
    # the shard that merges: one line, nothing published, the filled parts kept for the rerun
    _one_line(*result("shard1"), "lists.ivfdata", "no space left", "free space")
    listing = (logs / "new.ls").read_text()
    assert "index.json" not in listing
    assert "part-00000-of-00002.index" in listing and "part-00001-of-00002.index" in listing
    # a rebuild over a finished index: one line, and the index it would have replaced still answers
    _one_line(*result("over"), "lists.ivfdata", "no space left")
    rc, _ = result("query")
    assert rc == 0 and '"chunk"' in (logs / "query.out").read_text()
    assert (logs / "after.json").read_text() == (logs / "old.json").read_text()
    # space freed: the same command finishes
    assert result("again")[0] == 0, result("again")[1][-2000:]

"""The Raft journal: durable, group-committed, recoverable after a crash, loud about corruption.

The file format is checked against an encoder and parser written here from the spec (not
imported from the module), so a change of format shows up as a test failure. Every random
choice comes from a fixed seed; a failing seed becomes a named case.
"""

from __future__ import annotations

import ast
import logging
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from itertools import pairwise
from pathlib import Path

import pytest

import maxq_raft.replication.journal as journal_mod
from maxq_raft.replication.journal import (
    Journal,
    JournalClosed,
    JournalCorruption,
    JournalError,
    JournalStalled,
    verify,
)

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0

# ---------------------------------------------------------------------- the format, from the spec

HEADER = struct.Struct(">IIQQ")  # u32 length | u32 crc32(index, term, payload) | u64 index | u64 term


def encode(index: int, term: int, payload: bytes) -> bytes:
    crc = zlib.crc32(struct.pack(">QQ", index, term) + payload)
    return HEADER.pack(len(payload), crc, index, term) + payload


def parse(path: Path) -> list[tuple[int, int, int, bytes, int]]:
    """(offset, index, term, payload, end) of every complete, crc-valid record, in order."""
    data = path.read_bytes()
    out = []
    off = 0
    while off + HEADER.size <= len(data):
        length, crc, index, term = HEADER.unpack_from(data, off)
        end = off + HEADER.size + length
        if end > len(data) or zlib.crc32(data[off + 8 : end]) != crc:
            break
        out.append((off, index, term, data[off + HEADER.size : end], end))
        off = end
    return out


def seg_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.seg"))


def payload_for(i: int) -> bytes:
    return (b"%d;" % i) * (1 + (i * 7919) % 97)


def term_for(i: int) -> int:
    return 1 + i // 500


def fill(folder: Path, n: int, **kw) -> list[tuple[int, int, bytes]]:
    entries = [(i, term_for(i), payload_for(i)) for i in range(1, n + 1)]
    with Journal.open(folder, **kw) as j:
        for e in entries:
            j.append(*e)
        assert j.wait_durable(n, WAIT_S)
    return entries


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def write_meta(folder: Path, first_index: int) -> None:
    head = b"MQJM" + struct.pack(">IQ", 1, first_index)
    (folder / "journal.meta").write_bytes(head + struct.pack(">I", zlib.crc32(head)))


# ------------------------------------------------------------------------------- round trips


def test_round_trip_across_rollovers_reopen_and_disk_reads(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    entries = fill(folder, 3000, segment_max_bytes=64 * 1024)
    segs = seg_files(folder)
    assert len(segs) > 5
    # each segment is named by its first index and holds spec-format records, contiguous overall
    seen = []
    for seg in segs:
        recs = parse(seg)
        assert recs and int(seg.stem) == recs[0][1]
        assert recs[-1][4] == seg.stat().st_size  # nothing but whole records
        assert seg.stat().st_size <= 64 * 1024
        seen += [(idx, term, payload) for _, idx, term, payload, _ in recs]
    assert seen == entries
    # reopen; tail cache 0 makes every read come from disk through the sparse offset index
    with Journal.open(folder, tail_cache_bytes_max=0, segment_max_bytes=64 * 1024) as j:
        assert (j.first_index, j.last_index, j.durable_index, j.last_term) == (1, 3000, 3000, term_for(3000))
        assert list(j.read(1)) == entries
        rng = random.Random(7)
        for _ in range(50):
            a = rng.randint(1, 3000)
            b = rng.randint(a, 3100)
            assert list(j.read(a, b)) == entries[a - 1 : b]
        assert list(j.read(3001)) == []
        for i in range(3001, 3101):  # appends continue in the last segment / new ones
            j.append(i, term_for(i), payload_for(i))
            entries.append((i, term_for(i), payload_for(i)))
        assert list(j.read(2990)) == entries[2989:]  # mixes disk and not-yet-written memory
        assert j.wait_durable(3100, WAIT_S)
        assert list(j.read(2990)) == entries[2989:]
    with Journal.open(folder) as j:
        assert list(j.read(1)) == entries


def test_checkpoints_inside_big_segments(tmp_path: Path) -> None:
    """Segments larger than the checkpoint stride: reads seek through the sparse index."""
    folder = tmp_path / "j"
    entries = [(i, 1, bytes([i % 251]) * 1000) for i in range(1, 2501)]
    with Journal.open(folder, segment_max_bytes=1 << 20, tail_cache_bytes_max=0) as j:
        for e in entries:
            j.append(*e)
        assert j.wait_durable(2500, WAIT_S)
        rng = random.Random(11)
        for _ in range(40):
            a = rng.randint(1, 2500)
            b = a + rng.randint(0, 300)
            assert list(j.read(a, b)) == entries[a - 1 : b]
            assert list(j.read(a, a)) == [entries[a - 1]]
        assert list(j.read(1)) == entries
    assert len(seg_files(folder)) == 3


def test_big_record_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    big = b"B" * 10_000
    with Journal.open(folder, segment_max_bytes=1024) as j:
        j.append(1, 1, b"a")
        j.append(2, 1, big)
        j.append(3, 1, b"c")
        j.append(4, 1, b"")  # empty payloads are entries too
    assert [int(p.stem) for p in seg_files(folder)] == [1, 2, 3]
    with Journal.open(folder) as j:
        assert list(j.read(1)) == [(1, 1, b"a"), (2, 1, big), (3, 1, b"c"), (4, 1, b"")]


def test_file_format_is_the_spec(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    entries = [(1, 1, b"hello"), (2, 1, b""), (3, 7, bytes(range(256)))]
    with Journal.open(folder) as j:
        for e in entries:
            j.append(*e)
    assert [p.name for p in seg_files(folder)] == ["00000000000000000001.seg"]
    assert (folder / "00000000000000000001.seg").read_bytes() == b"".join(encode(*e) for e in entries)
    meta = (folder / "journal.meta").read_bytes()
    assert len(meta) == 20 and meta[:4] == b"MQJM" and struct.unpack(">IQ", meta[4:16]) == (1, 1)
    assert zlib.crc32(meta[:16]) == struct.unpack(">I", meta[16:])[0]


def test_durable_index_advances_and_on_durable_increases(tmp_path: Path) -> None:
    calls: list[int] = []
    with Journal.open(tmp_path / "j", on_durable=calls.append) as j:
        assert j.durable_index == 0
        for i in range(1, 5001):
            j.append(i, 1, b"x" * 50)
            assert j.durable_index <= j.last_index == i
        assert list(j.read(4999)) == [(4999, 1, b"x" * 50), (5000, 1, b"x" * 50)]  # readable at once
        assert j.wait_durable(5000, WAIT_S)
        assert j.durable_index == 5000
    assert calls and calls[-1] == 5000
    assert all(a < b for a, b in pairwise(calls)), calls[:20]


@pytest.mark.parametrize("fsync_delay_s", [0.0, 0.002])
def test_group_commit_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync_delay_s: float) -> None:
    """10,000 appends cost far fewer fdatasyncs: while one runs, the next batch queues up."""
    real = os.fdatasync
    count = [0]

    def counting_fdatasync(fd: int) -> None:
        count[0] += 1
        if fsync_delay_s:
            time.sleep(fsync_delay_s)  # a slow disk: batches only get bigger
        real(fd)

    j = Journal.open(tmp_path / "j")
    monkeypatch.setattr(journal_mod.os, "fdatasync", counting_fdatasync)
    n = 10_000
    t0 = time.monotonic()
    for i in range(1, n + 1):
        j.append(i, 1, b"m" * 16)
    append_s = time.monotonic() - t0
    assert j.wait_durable(n, WAIT_S)
    stats = j.stats()
    j.close()
    monkeypatch.undo()
    assert count[0] - 1 == stats["fdatasyncs"]  # +1: close's final fdatasync
    assert stats["batches"] == stats["fdatasyncs"] < n / 10, (stats, append_s)
    assert stats["batch_entries_max"] > 10


def test_fsync_off_skips_fdatasync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal.open(tmp_path / "j", fsync=False)
    count = [0]
    real = os.fdatasync
    monkeypatch.setattr(journal_mod.os, "fdatasync", lambda fd: (count.__setitem__(0, count[0] + 1), real(fd)))
    for i in range(1, 1001):
        j.append(i, 1, b"x")
    assert j.wait_durable(1000, WAIT_S)
    assert count[0] == 0 and j.stats()["fdatasyncs"] == 0
    j.close()  # a clean stop still syncs once
    assert count[0] == 1


# ---------------------------------------------------------------------------------- crash safety

CHILD = r"""
import sys, time
from pathlib import Path
from maxq_raft.replication.journal import Journal

def payload_for(i):
    return (b"%d;" % i) * (1 + (i * 7919) % 97)

def term_for(i):
    return 1 + i // 500

out = open(sys.argv[2], "a")
def on_durable(i):
    out.write("D %d\n" % i)
    out.flush()          # the line reaches the kernel before the next batch starts

j = Journal.open(Path(sys.argv[1]), segment_max_bytes=int(sys.argv[3]), on_durable=on_durable,
                 queue_bytes_max=1 << 20)
i = j.last_index + 1
out.write("READY %d\n" % i)
out.flush()
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    j.append(i, term_for(i), payload_for(i))
    i += 1
"""


def _run_and_kill(tmp_path: Path, folder: Path, delay_s: float, round_: int) -> int:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / f"out{round_}.txt"
    out.write_text("")
    proc = subprocess.Popen([sys.executable, str(script), str(folder), str(out), str(256 * 1024)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 15
        # The kill delay counts from the first durable entry, not from start-up: on a loaded
        # machine a child can take longer than the delay to make its first fsync.
        while "\nD " not in "\n" + out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "child made nothing durable in 15 s"
            time.sleep(0.01)
        time.sleep(delay_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    durable = [int(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("D ")]
    assert durable, "nothing became durable before the kill"
    return max(durable)


def _check_holds(folder: Path, durable: int) -> int:
    with Journal.open(folder, tail_cache_bytes_max=0) as j:
        assert j.last_index >= durable
        got = list(j.read(1, durable))
        assert len(got) == durable
        for i, term, payload in got:
            assert (term, payload) == (term_for(i), payload_for(i)), i
        return j.last_index


@pytest.mark.parametrize("delay_s", [0.05, 0.15, 0.3, 0.6])
def test_sigkill_loses_no_durable_entry(tmp_path: Path, delay_s: float) -> None:
    folder = tmp_path / "j"
    rng = random.Random(int(delay_s * 1000))
    for round_ in range(2):  # the second round recovers the first's crash, then crashes again
        durable = _run_and_kill(tmp_path, folder, delay_s / (round_ + 1), round_)
        assert verify(folder) == []
        # Power-loss emulation on a copy: whatever was not yet fdatasynced is lost, i.e. the
        # segment holding the last durable entry is cut anywhere after it, later segments vanish.
        lost = tmp_path / f"lost{round_}"
        shutil.copytree(folder, lost)
        for seg in seg_files(lost):
            recs = parse(seg)
            if int(seg.stem) > durable:
                seg.unlink()
            elif recs and recs[-1][1] >= durable:
                end = next(r[4] for r in recs if r[1] == durable)
                with open(seg, "r+b") as f:
                    f.truncate(rng.randint(end, seg.stat().st_size))
        _check_holds(lost, durable)
        _check_holds(folder, durable)


# ------------------------------------------------------------------------------------- torn tails


def _prepare(tmp_path: Path, n: int = 60, segment_max_bytes: int = 2048) -> tuple[Path, list]:
    folder = tmp_path / "base"
    return folder, fill(folder, n, segment_max_bytes=segment_max_bytes)


def test_torn_tail_cut_at_random_positions(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    base, entries = _prepare(tmp_path)
    last_seg = seg_files(base)[-1]
    last_off, last_index, _, _, last_end = parse(last_seg)[-1]
    assert last_index == len(entries)
    rng = random.Random(1234)
    cuts = sorted(
        {rng.randint(last_off + 1, last_end - 1) for _ in range(25)}
        | {last_off + 1, last_off + 23, last_off + 24, last_end - 1}
    )
    for k, cut in enumerate(cuts):
        folder = tmp_path / f"cut{k}"
        shutil.copytree(base, folder)
        seg = folder / last_seg.name
        os.truncate(seg, cut)
        assert verify(folder) == []  # a torn tail is no corruption
        assert seg.stat().st_size == cut  # and verify changes nothing
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=journal_mod.__name__), Journal.open(folder) as j:
            assert (j.last_index, j.durable_index) == (len(entries) - 1, len(entries) - 1)
            assert list(j.read(1)) == entries[:-1]
            j.append(*entries[-1])
        assert any("torn tail" in r.getMessage() and str(seg) in r.getMessage() for r in caplog.records)
        with Journal.open(folder) as j:
            assert list(j.read(1)) == entries


def test_torn_tail_bad_crc_or_zero_fill(tmp_path: Path) -> None:
    base, entries = _prepare(tmp_path)
    last_seg = seg_files(base)[-1]
    last_off, _, _, _, last_end = parse(last_seg)[-1]
    # the last record's crc is bad and nothing valid follows: torn, cut off
    folder = tmp_path / "crc"
    shutil.copytree(base, folder)
    flip(folder / last_seg.name, last_end - 1)
    with Journal.open(folder) as j:
        assert list(j.read(1)) == entries[:-1]
    assert (folder / last_seg.name).stat().st_size == last_off
    # the file was extended with zeros (blocks allocated, data never written): nothing lost
    folder = tmp_path / "zeros"
    shutil.copytree(base, folder)
    with open(folder / last_seg.name, "ab") as f:
        f.write(bytes(4096))
    assert verify(folder) == []
    with Journal.open(folder) as j:
        assert list(j.read(1)) == entries
    assert (folder / last_seg.name).stat().st_size == last_end


def test_torn_only_record_of_last_segment(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    with Journal.open(folder, segment_max_bytes=100) as j:  # one ~80 byte record per segment
        for i in range(1, 6):
            j.append(i, 1, b"%d" % i * 50)
    last = seg_files(folder)[-1]
    assert last.name == "00000000000000000005.seg"
    os.truncate(last, 30)
    with Journal.open(folder, segment_max_bytes=100) as j:
        assert j.last_index == 4 and last.stat().st_size == 0  # the empty segment stays, named 5
        j.append(5, 2, b"again")
    with Journal.open(folder) as j:
        assert list(j.read(4)) == [(4, 1, b"4" * 50), (5, 2, b"again")]
    assert verify(folder) == []


def test_empty_last_segment_from_a_crash_after_rollover(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    entries = fill(folder, 10)
    (folder / "00000000000000000011.seg").write_bytes(b"")
    assert verify(folder) == []
    with Journal.open(folder) as j:
        assert j.last_index == 10
        j.append(11, 9, b"eleven")
    with Journal.open(folder) as j:
        assert list(j.read(1)) == entries + [(11, 9, b"eleven")]


# ------------------------------------------------------------------------------------ corruption


def _expect_corruption(folder: Path, path: Path, offset: int, what: str) -> JournalCorruption:
    with pytest.raises(JournalCorruption) as info:
        Journal.open(folder)
    msg = str(info.value)
    assert msg.startswith(f"{what}") and f" at offset {offset} in {path}" in msg, msg
    assert (info.value.path, info.value.offset) == (path, offset)
    assert verify(folder) == [msg]  # the offline check reports the same problem
    assert not any(folder.glob("*.tmp"))
    return info.value


def test_flipped_byte_in_the_middle_of_the_last_segment(tmp_path: Path) -> None:
    base, _ = _prepare(tmp_path)
    folder = tmp_path / "j"
    shutil.copytree(base, folder)
    seg = seg_files(folder)[-1]
    recs = parse(seg)
    assert len(recs) >= 3
    off, _, _, payload, _ = recs[1]
    size_before = seg.stat().st_size
    flip(seg, off + 24 + len(payload) // 2)
    exc = _expect_corruption(folder, seg, off, "crc mismatch")
    assert f"a valid record follows at offset {recs[2][0]}" in str(exc)
    assert seg.stat().st_size == size_before  # never "repaired" by cutting valid records


def test_flipped_length_field_in_the_middle(tmp_path: Path) -> None:
    base, _ = _prepare(tmp_path)
    folder = tmp_path / "j"
    shutil.copytree(base, folder)
    seg = seg_files(folder)[-1]
    off = parse(seg)[1][0]
    flip(seg, off)  # the high byte of the length: an implausible length
    _expect_corruption(folder, seg, off, "implausible record length")


def test_flipped_byte_in_a_segment_that_is_not_the_last(tmp_path: Path) -> None:
    base, _ = _prepare(tmp_path)
    folder = tmp_path / "j"
    shutil.copytree(base, folder)
    seg = seg_files(folder)[0]
    last_off, _, _, _, end = parse(seg)[-1]
    flip(seg, end - 1)  # the last record of a closed segment can never be torn
    exc = _expect_corruption(folder, seg, last_off, "crc mismatch")
    assert "only the last segment" in str(exc)


def test_cut_segment_in_the_middle(tmp_path: Path) -> None:
    base, _ = _prepare(tmp_path)
    folder = tmp_path / "j"
    shutil.copytree(base, folder)
    seg = seg_files(folder)[1]
    last_off = parse(seg)[-1][0]
    os.truncate(seg, last_off + 10)
    _expect_corruption(folder, seg, last_off, "incomplete record header")


def test_missing_middle_segment(tmp_path: Path) -> None:
    base, _ = _prepare(tmp_path)
    folder = tmp_path / "j"
    shutil.copytree(base, folder)
    segs = seg_files(folder)
    assert len(segs) >= 4
    gone = segs[2]
    prev_last = parse(segs[1])[-1][1]
    gone.unlink()
    exc = _expect_corruption(folder, segs[3], 0, "gap in indexes")
    assert f"ends at index {prev_last}" in str(exc) and "missing segment" in str(exc)


def test_missing_first_segment(tmp_path: Path) -> None:
    base, _ = _prepare(tmp_path)
    folder = tmp_path / "j"
    shutil.copytree(base, folder)
    segs = seg_files(folder)
    segs[0].unlink()
    exc = _expect_corruption(folder, segs[1], 0, "missing segment")
    assert "begins at index 1" in str(exc)


@pytest.mark.parametrize(
    "indexes, bad_pos, what",
    [
        ([1, 2, 4, 5], 2, "gap in indexes: index 4 where 3 expected"),
        ([1, 2, 2, 3], 2, "repeat in indexes: index 2 where 3 expected"),
        ([1, 2, 3, 4], 3, None),  # control: fine
        ([1, 2, 4], 2, "gap in indexes"),  # valid crc, wrong index: corruption even as the last record
    ],
)
def test_gap_or_repeat_inside_a_segment(tmp_path: Path, indexes: list[int], bad_pos: int, what: str | None) -> None:
    folder = tmp_path / "j"
    folder.mkdir()
    write_meta(folder, 1)
    recs = [encode(i, 1, b"p%d" % i) for i in indexes]
    seg = folder / "00000000000000000001.seg"
    seg.write_bytes(b"".join(recs))
    if what is None:
        assert verify(folder) == []
        with Journal.open(folder) as j:
            assert j.last_index == 4
        return
    _expect_corruption(folder, seg, sum(len(r) for r in recs[:bad_pos]), what)


def test_segment_name_disagrees_with_its_first_record(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    folder.mkdir()
    write_meta(folder, 1)
    (folder / "00000000000000000001.seg").write_bytes(encode(1, 1, b"a") + encode(2, 1, b"b"))
    seg = folder / "00000000000000000003.seg"
    seg.write_bytes(encode(4, 1, b"d"))
    _expect_corruption(folder, seg, 0, "gap in indexes: index 4 where 3 expected (segment name)")


def test_term_going_backwards_is_corruption(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    folder.mkdir()
    write_meta(folder, 1)
    seg = folder / "00000000000000000001.seg"
    seg.write_bytes(encode(1, 5, b"a") + encode(2, 4, b"b") + encode(3, 5, b"c"))
    _expect_corruption(folder, seg, len(encode(1, 5, b"a")), "term goes backwards")


@pytest.mark.parametrize("damage", ["garbage", "short", "bad crc", "missing"])
def test_unreadable_or_missing_meta(tmp_path: Path, damage: str) -> None:
    base, _ = _prepare(tmp_path, n=10)
    folder = tmp_path / "j"
    shutil.copytree(base, folder)
    meta = folder / "journal.meta"
    if damage == "garbage":
        meta.write_bytes(os.urandom(20))
        expected = ("bad meta magic", 0)
    elif damage == "short":
        meta.write_bytes(meta.read_bytes()[:7])
        expected = ("meta file has 7 bytes", 7)
    elif damage == "bad crc":
        flip(meta, 15)
        expected = ("meta crc mismatch", 16)
    else:
        meta.unlink()
        expected = ("meta file missing although segments exist", 0)
    _expect_corruption(folder, meta, expected[1], expected[0])


def test_verify_reports_several_problems_and_healthy_is_empty(tmp_path: Path) -> None:
    base, _ = _prepare(tmp_path)
    assert verify(base) == []
    folder = tmp_path / "j"
    shutil.copytree(base, folder)
    segs = seg_files(folder)
    flip(segs[0], parse(segs[0])[0][4] - 1)
    segs[2].unlink()
    problems = verify(folder)
    assert len(problems) == 2, problems
    assert str(segs[0]) in problems[0] and "crc mismatch" in problems[0]
    assert str(segs[3]) in problems[1] and "gap" in problems[1]
    assert verify(tmp_path / "nope") == [f"{tmp_path / 'nope'}: not a directory"]


def test_verify_refuses_a_journal_that_is_open(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j") as j:
        j.append(1, 1, b"x")
        problems = verify(tmp_path / "j")
        assert len(problems) == 1 and "open in another process" in problems[0]
    assert verify(tmp_path / "j") == []


# ------------------------------------------------------------------------- truncate and compact


def test_truncate_after_across_segments_and_reopen(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    entries = fill(folder, 200, segment_max_bytes=2048)
    n_before = len(seg_files(folder))
    with Journal.open(folder, segment_max_bytes=2048) as j:
        j.truncate_after(120)
        assert (j.last_index, j.durable_index, j.last_term) == (120, 120, term_for(120))
        assert list(j.read(1)) == entries[:120]
        segs = seg_files(folder)
        assert len(segs) < n_before and parse(segs[-1])[-1][1] == 120  # on disk already
        assert segs[-1].stat().st_size == parse(segs[-1])[-1][4]
        with pytest.raises(ValueError):
            j.append(122, 9, b"gap")
        j.append(121, 9, b"new term")
        assert j.wait_durable(121, WAIT_S)
    assert verify(folder) == []
    with Journal.open(folder) as j:
        assert list(j.read(119)) == entries[118:120] + [(121, 9, b"new term")]


def test_truncate_at_a_segment_boundary_and_everything(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    entries = fill(folder, 50, segment_max_bytes=1024)
    starts = [int(p.stem) for p in seg_files(folder)]
    boundary = starts[3] - 1
    with Journal.open(folder, segment_max_bytes=1024) as j:
        j.truncate_after(boundary)
        assert [int(p.stem) for p in seg_files(folder)] == starts[:3]
        assert list(j.read(1)) == entries[:boundary]
        j.truncate_after(0)  # first_index - 1: drop everything
        assert (j.first_index, j.last_index, j.durable_index) == (1, 0, 0)
        assert seg_files(folder) == []
        with pytest.raises(ValueError):
            j.truncate_after(-1)
        j.append(1, 3, b"fresh")
    with Journal.open(folder) as j:
        assert list(j.read(1)) == [(1, 3, b"fresh")]


def test_truncate_entries_still_being_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A term conflict arrives while the writer is mid-batch: the batch may land, then is cut."""
    real = os.fdatasync
    monkeypatch.setattr(journal_mod.os, "fdatasync", lambda fd: (time.sleep(0.01), real(fd)))
    folder = tmp_path / "j"
    calls: list[int] = []
    with Journal.open(folder, segment_max_bytes=4096, on_durable=calls.append) as j:
        for i in range(1, 2001):
            j.append(i, 1, payload_for(i))
        j.truncate_after(1500)
        assert j.durable_index <= 1500 and j.last_index == 1500
        for i in range(1501, 1601):
            j.append(i, 2, b"t2-%d" % i)
        assert j.wait_durable(1600, WAIT_S)
    assert max(calls) == 1600
    monkeypatch.undo()
    with Journal.open(folder) as j:
        got = list(j.read(1))
    assert got == [(i, 1, payload_for(i)) for i in range(1, 1501)] + [(i, 2, b"t2-%d" % i) for i in range(1501, 1601)]


def test_compact_before_deletes_whole_segments_and_survives_reopen(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    entries = fill(folder, 300, segment_max_bytes=2048)
    starts = [int(p.stem) for p in seg_files(folder)]
    with Journal.open(folder, segment_max_bytes=2048) as j:
        j.compact_before(150)
        assert j.first_index == 150
        kept = [int(p.stem) for p in seg_files(folder)]
        holder = max(s for s in starts if s <= 150)
        assert kept == [s for s in starts if s >= holder]  # only whole segments below went
        assert list(j.read(150, 152)) == entries[149:152]
        with pytest.raises(ValueError):
            j.read(149)
        j.compact_before(100)  # going back is a no-op
        assert j.first_index == 150
    with Journal.open(folder, segment_max_bytes=2048) as j:
        assert (j.first_index, j.last_index) == (150, 300)
        assert list(j.read(150)) == entries[149:]
        for i in range(301, 401):  # compact, then append more
            j.append(i, term_for(i), payload_for(i))
            entries.append((i, term_for(i), payload_for(i)))
        j.compact_before(301)
        j.compact_before(j.last_index + 1)  # everything is in the snapshot; the log stays open-ended
        assert (j.first_index, j.last_index) == (401, 400)
        j.append(401, 5, b"after")
    with Journal.open(folder) as j:
        assert (j.first_index, j.last_index, j.durable_index) == (401, 401, 401)
        assert list(j.read(401)) == [(401, 5, b"after")]
    assert verify(folder) == []


def test_compact_beyond_the_end_empties_the_log(tmp_path: Path) -> None:
    """A snapshot installed from the leader beyond our log: the log restarts at its index."""
    folder = tmp_path / "j"
    fill(folder, 50, segment_max_bytes=1024)
    with Journal.open(folder) as j:
        j.compact_before(1000)
        assert (j.first_index, j.last_index, j.durable_index) == (1000, 999, 999)
        assert seg_files(folder) == []
        assert list(j.read(1000)) == []
        with pytest.raises(ValueError):
            j.append(51, 1, b"x")
    with Journal.open(folder) as j:  # nothing on disk but the meta: the restart knows where to go on
        assert (j.first_index, j.last_index) == (1000, 999)
        j.append(1000, 7, b"k")
    with Journal.open(folder) as j:
        assert list(j.read(1000)) == [(1000, 7, b"k")]
        assert [p.name for p in seg_files(folder)] == ["00000000000000001000.seg"]


def test_interrupted_compaction_leftovers_are_deleted(tmp_path: Path) -> None:
    """A crash after the meta was written but before the segments were deleted."""
    folder = tmp_path / "j"
    entries = fill(folder, 300, segment_max_bytes=2048)
    saved = tmp_path / "saved"
    shutil.copytree(folder, saved)
    with Journal.open(folder) as j:
        j.compact_before(200)
    for seg in seg_files(saved):  # put the deleted segments back
        if not (folder / seg.name).exists():
            shutil.copy(seg, folder / seg.name)
    assert verify(folder) == []
    with Journal.open(folder) as j:
        assert (j.first_index, j.last_index) == (200, 300)
        assert list(j.read(200)) == entries[199:]
    assert min(int(p.stem) for p in seg_files(folder)) <= 200 < min(int(p.stem) for p in seg_files(folder)[1:])
    # the same after a compaction past the end of the log
    with Journal.open(folder) as j:
        j.compact_before(5000)
    shutil.copy(seg_files(saved)[-1], folder / seg_files(saved)[-1].name)
    with Journal.open(folder) as j:
        assert (j.first_index, j.last_index) == (5000, 4999)
    assert seg_files(folder) == []


def test_random_operations_against_a_model(tmp_path: Path) -> None:
    """Seeded runs of append / truncate / compact / reopen / read, checked against a list."""
    for seed in (1, 2, 3):
        rng = random.Random(seed)
        folder = tmp_path / f"seed{seed}"
        model: dict[int, tuple[int, bytes]] = {}
        first, last, term = 1, 0, 1

        def open_() -> Journal:
            return Journal.open(
                folder,
                segment_max_bytes=rng.choice([300, 1000, 5000]),
                tail_cache_bytes_max=rng.choice([0, 500, 1 << 20]),
                fsync=rng.random() < 0.5,
            )

        j = open_()
        try:
            for step in range(150):
                op = rng.choices(["append", "truncate", "compact", "reopen", "wait"], [8, 2, 1, 1, 1])[0]
                if op == "append":
                    if rng.random() < 0.2:
                        term += 1
                    for _ in range(rng.randint(1, 30)):
                        last += 1
                        model[last] = (term, rng.randbytes(rng.randint(0, 200)))
                        j.append(last, *model[last])
                elif op == "truncate":
                    k = rng.randint(first - 1, last)
                    j.truncate_after(k)
                    last = k
                elif op == "compact":
                    k = rng.randint(first, last + 3)
                    j.compact_before(k)
                    first = max(first, k)
                    last = max(last, first - 1)
                elif op == "reopen":
                    j.close()
                    j = open_()
                else:
                    assert j.wait_durable(last, WAIT_S)
                assert (j.first_index, j.last_index) == (first, last), (seed, step, op)
                a = rng.randint(first, last + 1)
                b = rng.randint(a - 1, last + 1)
                assert list(j.read(a, b)) == [(i, *model[i]) for i in range(a, min(b, last) + 1)], (seed, step, op)
            j.close()
            assert verify(folder) == []
            j = open_()
            assert list(j.read(first)) == [(i, *model[i]) for i in range(first, last + 1)]
        finally:
            j.close()


def test_read_iterator_is_invalidated_by_truncate(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j") as j:
        for i in range(1, 101):
            j.append(i, 1, b"x")
        it = j.read(1)
        assert next(it)[0] == 1
        j.truncate_after(50)
        with pytest.raises(RuntimeError):
            list(it)


# --------------------------------------------------------------------------- contract and bounds


def test_append_contract_and_close(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    j = Journal.open(folder)
    with pytest.raises(ValueError):
        j.append(2, 1, b"gap")  # the first index of a fresh log is 1
    j.append(1, 3, b"a")
    with pytest.raises(ValueError):
        j.append(1, 3, b"repeat")
    with pytest.raises(ValueError):
        j.append(3, 3, b"gap")
    with pytest.raises(ValueError):
        j.append(2, 2, b"term goes back")
    with pytest.raises(ValueError):
        j.read(0)
    with pytest.raises(JournalError):
        Journal.open(folder)  # one owner per folder
    j.close()
    j.close()  # idempotent
    assert j.closed and j.durable_index == 1
    with pytest.raises(JournalClosed):
        j.append(2, 3, b"b")
    with pytest.raises(JournalClosed):
        j.read(1)
    assert j.wait_durable(1, 0.1) and not j.wait_durable(2, 0.1)
    with Journal.open(folder) as j2:
        assert list(j2.read(1)) == [(1, 3, b"a")]


def test_append_queue_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fdatasync
    monkeypatch.setattr(journal_mod.os, "fdatasync", lambda fd: (time.sleep(0.003), real(fd)))
    with Journal.open(tmp_path / "j", queue_bytes_max=2048) as j:
        for i in range(1, 301):
            j.append(i, 1, b"q" * 100)
            assert j.stats()["queue_bytes"] <= 2048
        assert j.wait_durable(300, WAIT_S)
        assert j.stats()["queue_bytes"] == 0


def test_append_wait_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fdatasync
    monkeypatch.setattr(journal_mod.os, "fdatasync", lambda fd: (time.sleep(0.3), real(fd)))
    with Journal.open(tmp_path / "j", queue_bytes_max=256, append_wait_s_max=0.05) as j:
        j.append(1, 1, b"x" * 200)
        t0 = time.monotonic()
        with pytest.raises(JournalStalled):
            j.append(2, 1, b"y" * 200)
        assert time.monotonic() - t0 < 0.3
        assert j.last_index == 1


def test_writer_failure_is_reported_never_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    j = Journal.open(tmp_path / "j")

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal_mod.os, "fdatasync", failing)
    with caplog.at_level(logging.CRITICAL):
        j.append(1, 1, b"x")
        with pytest.raises(JournalError):
            j.wait_durable(1, WAIT_S)
        assert j.durable_index == 0
        with pytest.raises(JournalError):
            j.append(2, 1, b"y")
        with pytest.raises(JournalError):
            j.close()
    j.close()


def test_close_wakes_waiters_in_other_threads(tmp_path: Path) -> None:
    j = Journal.open(tmp_path / "j")
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(j.wait_durable(10, WAIT_S)))
    waiter.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    j.close()
    waiter.join(WAIT_S)
    assert result == [False] and time.monotonic() - t0 < 2


def test_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(journal_mod.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no imports from our own packages"
            names.add(node.module.split(".")[0])
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names
    assert not names & {"trio", "pysyncobj"}


# ------------------------------------------------------------- the owner's own writes (write_pending)


def _idle_writer(j: Journal) -> None:
    deadline = time.monotonic() + WAIT_S
    while not j._writer_idle and time.monotonic() < deadline:  # (bounded) the writer asleep
        time.sleep(0.001)
    assert j._writer_idle


def test_the_owner_writes_a_small_batch_itself_and_the_writer_stays_asleep(tmp_path: Path) -> None:
    calls: list[int] = []
    with Journal.open(tmp_path / "j", on_durable=calls.append) as j:
        j.wake_writer = False
        _idle_writer(j)
        for i in range(1, 4):
            j.append(i, 1, payload_for(i))
        assert j.durable_index == 0 and j.stats()["batches"] == 0  # nobody woke the writer
        assert j.write_pending(64 * 1024) == 3
        assert j.durable_index == 3 and j.stats()["fdatasyncs"] == 1
        assert calls == []  # the owner knows: on_durable is the writer's
        assert j.write_pending(64 * 1024) is None  # nothing left
    with Journal.open(tmp_path / "j") as j:
        assert list(j.read(1)) == [(i, 1, payload_for(i)) for i in range(1, 4)]


def test_a_batch_over_the_bound_goes_to_the_writer(tmp_path: Path) -> None:
    calls: list[int] = []
    with Journal.open(tmp_path / "j", on_durable=calls.append) as j:
        j.wake_writer = False
        _idle_writer(j)
        for i in range(1, 11):
            j.append(i, 1, b"z" * 1000)
        assert j.write_pending(4096) is None  # 10 KB: the writer's
        assert j.wait_durable(10, WAIT_S) and calls[-1] == 10


def test_an_owner_write_that_fails_fails_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal.open(tmp_path / "j")
    j.wake_writer = False
    _idle_writer(j)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_mod.os, "fdatasync", full)
    j.append(1, 1, b"x")
    with pytest.raises(JournalError, match="No space left"):
        j.write_pending(64 * 1024)
    assert j.durable_index == 0  # never claimed
    with pytest.raises(JournalError):
        j.append(2, 1, b"y")
    with pytest.raises(JournalError):
        j.wait_durable(1, 0.1)
    monkeypatch.undo()
    with pytest.raises(JournalError):
        j.close()
    j.close()

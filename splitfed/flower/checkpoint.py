"""The run's checkpoint: written atomically after every round, read by ``--resume``.

One file, ``DIR/checkpoint.pt``, holding the global model, the last finished
round, the last assignment, the policy's state, the settings and torch's RNG
state. It is written to a temporary file in the same folder, flushed and
fsynced, then moved over the old one with ``os.replace`` (atomic on POSIX), and
the folder is fsynced: a crash at any moment leaves either the old or the new
checkpoint, never half of one. It is read with ``torch.load(weights_only=True)``,
so a checkpoint file can hold tensors and plain values, never code.

A crash cannot damage a checkpoint, but a disk, a copy or a hand can, and torch's
zip reader checks no CRC: a flipped byte inside a tensor loads as a wrong weight.
So the file carries the sha256 of what it holds (round, settings, RNG state and
every tensor's name, dtype, shape and bytes), and :func:`load` refuses a file
whose contents no longer match it. A disk that fails while a checkpoint is written
(full, read-only, gone) is one :class:`~splitfed.errors.RunFolderError` line; the
previous checkpoint is left as it was.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shlex
import socket
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from splitfed.errors import ConfigError, RunFolderError
from splitfed.flower.metrics import METRICS, rows_kept
from splitfed.jsonio import draft_of, dumps, sync_folder

if TYPE_CHECKING:  # torch is imported where a checkpoint is made, written or read: a run folder's status needs none
    import torch

    from splitfed.engine.types import State

FILENAME = "checkpoint.pt"
FORMAT = 2  # 2: the sha256 is always there (a format-1 file may lack it: written before it was kept)


def _rng_state() -> torch.Tensor:
    """torch's RNG state now: a checkpoint's by default."""
    import torch

    return torch.get_rng_state()


@dataclass
class Checkpoint:
    round: int  # the last finished round (0: none yet)
    state: State
    settings: dict[str, Any]
    assignment: dict[str, tuple[int, ...]] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    rng: torch.Tensor = field(default_factory=_rng_state)
    data: str = ""  # sha256 of the dataset's files ("": none read, or a checkpoint from before it was kept)
    fleet: str = ""  # the run's clients as dealt (profile.dealt_digest); older: the fleet file's fleet_digest, or ""
    where: str = ""  # "HOST:/absolute/folder" it was written in ("": a checkpoint from before it was kept)
    # the run's key of its clients' binding secrets (RoundConfig.binding_key): a run resumed under its own name
    # derives the secrets the crashed one loaded with, so its loads may replace what it left on the tiers
    binding_key: str = field(default="", repr=False)
    # its round's metrics row: the checkpoint is written before the row, so a crash between the two leaves a
    # checkpoint whose row a resume puts back (restore_row); the other way round, round 1's row without a
    # checkpoint left a run that could be neither resumed nor started again
    row: dict[str, Any] | None = None
    # the file it was read from (device, inode, size, times: :func:`current`); () for one not read from a file
    stamp: tuple[int, ...] = field(default=(), repr=False, compare=False)


def restore_row(folder: str | Path, ckpt: Checkpoint, *, write: bool = True) -> bool:
    """Put back the metrics row of the checkpoint's round when a crash came between the checkpoint and the
    row: the file then holds rounds 1..r-1 whole (and perhaps the row cut short). Whether it did (``write``
    false: whether it would, writing nothing: a check before the folder is the run's). A file whose row of
    that round is not the checkpoint's copy of it is refused: the checkpoint is another run's (put there from
    another folder), and continuing would train that run's model under this one's rows."""
    from splitfed.flower.metrics import MetricsWriter, run_rows

    if ckpt.row is None or ckpt.round < 1:
        return False
    path = Path(folder) / METRICS
    rows = run_rows(path) if path.is_file() else []
    theirs = next((r for r in rows if r["round"] == ckpt.round), None)
    if theirs is not None and theirs != ckpt.row:
        raise ConfigError(f"cannot resume: {Path(folder) / FILENAME} is not the checkpoint of the run in {path}: "
                          f"its copy of round {ckpt.round}'s row differs from the file's (a checkpoint of another "
                          "run put in this folder?); put this run's checkpoint back, or start the run over with "
                          "--overwrite")
    held = [r["round"] for r in rows]
    lacks = sorted(set(range(1, ckpt.round)) - set(held))  # rows before its own, which no checkpoint puts back
    if lacks and ckpt.where and ckpt.where != place(folder):
        # nothing both hold to compare, but a checkpoint written elsewhere is the likelier stranger here than a
        # metrics file cut by hand: named first (check_rounds would blame the file)
        raise ConfigError(f"cannot resume: {Path(folder) / FILENAME} holds round {ckpt.round}, but {path} lacks "
                          f"round(s) {', '.join(map(str, lacks[:5]))}{', ...' if len(lacks) > 5 else ''}, and the "
                          f"checkpoint was written in {ckpt.where} (a checkpoint of another run "
                          "put in this folder?); put this run's checkpoint back (or its metrics file, if that was "
                          "cut), or start the run over with --overwrite")
    if held != list(range(1, ckpt.round)):
        return False
    if not write:
        return True
    writer = MetricsWriter(folder)
    writer.truncate_after(ckpt.round - 1)  # a cut-short line of it goes
    writer.append(ckpt.row)
    return True


def row_put_back(ckpt: Checkpoint) -> str:
    """What a resume that put its checkpoint's row back says (:func:`restore_row`)."""
    return (f"round {ckpt.round}'s metrics row, lost in a crash after its checkpoint was written, is put back "
            "from the checkpoint")


def _row(text: object) -> dict[str, Any] | None:
    try:
        row = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def place(folder: str | Path) -> str:
    """Where a run folder is: a checkpoint read elsewhere (a copied folder) belongs to another run."""
    return f"{socket.gethostname()}:{Path(folder).resolve()}"


def digest(payload: dict[str, Any]) -> str:
    """The sha256 of a checkpoint's contents (everything but the digest itself), independent of the zip's
    layout: tensors by name, dtype, shape and bytes."""
    import torch

    h = hashlib.sha256()

    def tensor(name: str, t: torch.Tensor) -> None:
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)  # the tensor's own bytes, not a copy

    h.update(f"{payload['format']}|{payload['round']}|".encode())
    h.update(str(payload["meta"]).encode())
    tensor("rng", payload["rng"])
    for k in sorted(payload["state"]):
        tensor(f"state.{k}", payload["state"][k])
    return h.hexdigest()


def save(folder: str | Path, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` atomically; a disk that fails on the way is one :class:`RunFolderError` line, and the
    previous checkpoint is left whole."""
    folder = Path(folder)
    kept = (folder / FILENAME).is_file()
    try:
        return _save(folder, ckpt)
    except OSError as e:
        # without a previous checkpoint nothing of the run is kept (a round's row is written after its
        # checkpoint): there is nothing to resume, and the same command starts it again
        then = (f"the previous one is kept: free space or fix the folder, then continue with --resume "
                f"{shlex.quote(str(folder))}" if kept
                else "no round is kept yet: free space or fix the folder, then run the same command again")
        raise RunFolderError(f"cannot write the checkpoint in {folder}: {e.strerror or e} ({then})") from None


class _Writer:
    """The file torch writes the checkpoint to. torch's zip writer turns an ``OSError`` raised by ``write``
    (a full disk, mid-file) into a ``RuntimeError`` of its own ("unexpected pos ..."): the error is kept here
    so that :func:`save` can say what happened."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return int(self.f.write(data))
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _save(folder: Path, ckpt: Checkpoint) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    meta = {"settings": ckpt.settings, "policy": ckpt.policy, "data": ckpt.data, "fleet": ckpt.fleet,
            "where": place(folder),
            "assignment": {k: list(v) for k, v in ckpt.assignment.items()}, "binding_key": ckpt.binding_key,
            "row": None if ckpt.row is None else dumps(ckpt.row)}  # a string: the row's own key order kept
    payload = {"format": FORMAT, "round": int(ckpt.round), "meta": json.dumps(meta, sort_keys=True),
               "rng": ckpt.rng.clone(), "state": {k: v.detach().cpu().clone() for k, v in ckpt.state.items()}}
    payload["sha256"] = digest(payload)
    final = folder / FILENAME
    tmp = draft_of(final)  # where runfolder looks for what a writer killed mid-write left
    try:
        with open(tmp, "wb") as f:
            out = _Writer(f)
            try:
                torch.save(payload, cast(IO[bytes], out))  # torch calls write and flush only
            except Exception:
                if out.error is not None:  # torch's echo of the disk's error: the disk's is the one to say
                    raise out.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    sync_folder(folder)
    return final


def resumed(folder: str | Path, out: str | Path | None = None) -> Checkpoint:
    """The checkpoint ``--resume FOLDER`` continues; an ``--out`` elsewhere is refused: a run cannot move."""
    ckpt = load(folder)
    if out is not None and Path(out).resolve() != Path(folder).resolve():  # one folder spelled two ways is fine
        raise ConfigError(f"--resume {folder} continues the run in {folder}: --out {out} cannot move it "
                          "(copy the folder first to continue a copy)")
    return ckpt


def resume_point(folder: str | Path, rounds: int) -> tuple[int, str]:
    """Where a run that ended early can be continued from: the last round its checkpoint holds (0: none kept)
    and the ``--rounds`` flag its resume needs ("" when the checkpoint already aims at ``rounds``). A
    checkpoint that cannot be read raises, as :func:`load` does."""
    if not (Path(folder) / FILENAME).is_file():
        return 0, ""
    ckpt = load(folder)
    return ckpt.round, "" if ckpt.settings.get("rounds") == rounds else f" --rounds {rounds}"


def current(folder: str | Path, held: Checkpoint | None = None) -> Checkpoint:
    """The checkpoint in ``folder`` now: ``held`` (one :func:`load` read and checked before) while the file
    there is still the one it was read from, else the file read again. A resume reads and checks its
    checkpoint once and hands it on; a checkpoint written since, or changed in place, is read again (a
    checkpoint is replaced whole, as a new file: another inode)."""
    if held is not None and held.stamp and held.stamp == _stamp(Path(folder) / FILENAME):
        return held
    return load(folder)


def _stamp(path: Path, st: os.stat_result | None = None) -> tuple[int, ...]:
    """Which file ``path`` is, and which version of it ((): none there)."""
    if st is None:
        try:
            st = path.stat()
        except OSError:
            return ()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def load(folder: str | Path) -> Checkpoint:
    """Read and check the checkpoint in ``folder`` (refused with a :class:`ConfigError` that says why)."""
    import torch

    folder = Path(folder)
    path = folder / FILENAME
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"cannot resume: {folder} is a file, not a run folder")
    if path.exists() and not path.is_file():
        raise ConfigError(f"cannot resume: {path} is not a file")
    if not folder.exists():
        raise ConfigError(f"cannot resume: there is no folder {folder}")
    if not path.is_file():
        kept = rows_kept(folder, cut=False)
        if kept:  # the rounds happened: the checkpoint was lost after (deleted, moved, a partial copy), or the
            # in-process backend ran them, which writes none; nothing in the folder says which
            raise ConfigError(f"cannot resume: {path} is missing, though {folder / METRICS} holds {kept} finished round(s): "
                              "put the checkpoint back, or start the run over with --overwrite (a run of the "
                              "in-process backend writes no checkpoint: it does not resume)")
        raise ConfigError(f"cannot resume: {path} does not exist (no round of that run finished: start it again "
                          "with --out)")
    try:
        with open(path, "rb") as f:
            stamp = _stamp(path, os.fstat(f.fileno()))  # of the very file read: one replaced meanwhile is not it
            payload = torch.load(f, weights_only=True)
        _known_format(path, payload.get("format"))
        saved = payload.get("sha256")  # None: a format-1 checkpoint from before the digest was kept
        if saved is None and payload["format"] == FORMAT:
            raise ConfigError(f"cannot resume: {path} is damaged: its sha256 is missing (every checkpoint of "
                              f"format {FORMAT} is written with one); restore it from a copy or start a new run")
        if saved is not None and saved != digest(payload):
            raise ConfigError(f"cannot resume: {path} is damaged: what it holds no longer matches the sha256 "
                              "written with it (a checkpoint is replaced whole, so this file was changed after "
                              "it was written); restore it from a copy or start a new run")
        meta = json.loads(payload["meta"])
        return Checkpoint(round=int(payload["round"]), state=dict(payload["state"]), settings=meta["settings"],
                          assignment={k: tuple(v) for k, v in meta["assignment"].items()},
                          policy=meta["policy"], rng=payload["rng"], data=str(meta.get("data", "")),
                          fleet=str(meta.get("fleet", "")),
                          where=str(meta.get("where", "")), binding_key=str(meta.get("binding_key", "")),
                          row=_row(meta.get("row")), stamp=stamp)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user-facing problem
        raise ConfigError(f"cannot read checkpoint {path}: it is corrupt or truncated ({type(e).__name__}: {e}); "
                          "a checkpoint is replaced whole, so this file was damaged after it was written; restore it "
                          "from a copy or start the run over with --overwrite") from None


def _known_format(path: Path, fmt: object) -> None:
    """Refuse a format this version cannot read, saying what to do: a newer one is read by the splitfed
    that wrote it; anything else is no checkpoint of a run to continue."""
    if type(fmt) is int and fmt in (1, FORMAT):  # not True: it equals 1
        return
    if type(fmt) is int and fmt > FORMAT:
        raise ConfigError(f"cannot resume: {path} is of checkpoint format {fmt}, written by a newer splitfed "
                          f"(this one reads formats 1 and {FORMAT}): resume it with that version")
    raise ConfigError(f"cannot resume: {path} is of checkpoint format {fmt!r}, which no splitfed writes (this "
                      f"one reads formats 1 and {FORMAT}): restore it from a copy or start the run over with "
                      "--overwrite")


class _Stub:
    """What a torch object in a checkpoint's pickle reads as (:func:`recorded_settings`): nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _MetaOnly(pickle.Unpickler):
    """A checkpoint's ``data.pkl`` read without torch: its tensors (and their storages) as :class:`_Stub`, their
    bytes (other files of the zip) never read; any other class than torch's and ``OrderedDict`` (the state's) is
    refused, so the file can make nothing run."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "collections" and name == "OrderedDict":
            return dict
        if module == "torch" or module.startswith("torch."):
            return _Stub
        raise pickle.UnpicklingError(f"{module}.{name} is no part of a checkpoint")

    def persistent_load(self, pid: Any) -> Any:
        return None


MAX_PICKLE = 64 << 20  # bytes of a checkpoint's data.pkl read for its settings: its tensors' bytes are elsewhere


def recorded_settings(folder: Path) -> dict[str, Any]:
    """The settings the run's checkpoint records, {} where it has none or cannot be read (``splitfed report`` on a
    run stopped before its end: no summary.json). Read from the zip that ``torch.save`` wrote without torch
    (:class:`_MetaOnly`): no torch imported, none of its weights read. Not checked against its sha256: these say
    what the run was (mode, tiers), and a resume checks the file before it uses it."""
    path = folder / FILENAME
    if not path.is_file():
        return {}
    try:
        with zipfile.ZipFile(path) as z:
            info = next((i for i in z.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"),
                        None)
            if info is None or info.file_size > MAX_PICKLE:
                return {}
            payload = _MetaOnly(io.BytesIO(z.read(info))).load()
        meta = json.loads(payload["meta"]) if isinstance(payload, dict) and isinstance(payload.get("meta"), str) \
            else None
    except Exception:  # noqa: BLE001 - any file that is not a readable checkpoint says nothing of the run
        return {}
    settings = meta.get("settings") if isinstance(meta, dict) else None
    return settings if isinstance(settings, dict) else {}

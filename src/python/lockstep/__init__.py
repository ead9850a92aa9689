"""lockstep: the data-parallel trainer, from Python.

    import numpy as np, lockstep

    config = lockstep.Config.from_yaml("configs/quickstart.yaml",
                                       overrides={"trainer.devices": 2})
    data = lockstep.InMemoryDataset(x, y)          # x: float32 (n, f), y: int (n,)
    trainer = lockstep.Trainer(config, train=data)
    trainer.on_step(lambda m: print(m.step, m.loss))
    summary = trainer.run()
    print(summary.samples_per_s, summary.to_dict()["param_hash"])

The workers are C++ threads, one per device; ``run()`` releases the interpreter's lock for the
whole run and takes it only to call a callback, on worker 0's thread (global rank 0). Ctrl-C
(KeyboardInterrupt) or ``request_stop()`` stops the run after the current step, with a checkpoint
when ``trainer.checkpoint.dir`` is set, as SIGINT does for the ``lockstep`` command.

Datasets borrow numpy arrays that already have the layout the trainer reads (C-contiguous
float32 features, int32 labels, uint16 or uint32 tokens): no copy is made, and the dataset keeps
the array alive. Other arrays are converted once, and ``dataset.copied`` says so. A borrowed
array must not be written while a run reads it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from . import _lockstep
from ._lockstep import ConfigError, Error, InputError, WorkerError

for _error in (ConfigError, Error, InputError, WorkerError):
    _error.__module__ = __name__  # lockstep.InputError in tracebacks, as users import it
__version__: str = _lockstep.__version__
__all__ = [
    "Checkpoint", "Config", "ConfigError", "Dataset", "Error", "EvalMetrics", "ExportResult",
    "InMemoryDataset", "InputError", "Sample", "StepMetrics", "Summary", "TokenDataset", "Trainer",
    "WorkerError", "export", "load_checkpoint", "load_dataset", "sample",
]

PathLike = Union[str, "os.PathLike[str]"]


def __dir__() -> list[str]:
    """The API (``__all__``), not the modules this one imports."""
    return sorted(__all__ + ["__version__"])


# ---- config -------------------------------------------------------------------------------

def _override_value(value: Any) -> str:
    """A Python value as the text of a ``--set key=value`` override (YAML)."""
    if isinstance(value, np.generic):  # np.float32(0.1), np.int64(3): their Python value
        value = value.item()
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, (list, tuple, np.ndarray)):
        return json.dumps(list(value), default=_json_value)
    raise TypeError(f"override value {value!r}: expected None, a bool, a number, a string or a list")


def _json_value(value: Any) -> Any:
    """numpy's scalars and arrays as the Python values JSON writes (json.dumps' default)."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{value!r} (a {type(value).__name__}): expected None, a bool, a number, a "
                    f"string, a list or a dict")


def _overrides(overrides: Optional[Mapping[str, Any]]) -> list[str]:
    return [f"{key}={_override_value(value)}" for key, value in (overrides or {}).items()]


def _nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """{"a.b": 1, "a": {"c": 2}} -> {"a": {"b": 1, "c": 2}}."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            value = _nest(value)
        *parents, leaf = str(key).split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf].update(value)
        else:
            node[leaf] = value
    return out


class Config:
    """A validated training config: what a YAML file for ``lockstep train`` holds.

    Built by :meth:`from_yaml` or :meth:`from_dict`, with the checks and messages of the CLI:
    a bad key or value raises :class:`ConfigError` naming it.
    """

    def __init__(self, native: _lockstep._Config):
        self._native = native

    @classmethod
    def from_yaml(cls, path: PathLike, overrides: Optional[Mapping[str, Any]] = None) -> "Config":
        """Reads a YAML config; ``overrides`` maps keys ("trainer.devices") to values, applied
        as ``--set`` applies them."""
        return cls(_lockstep._load_config(os.fspath(path), _overrides(overrides)))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any],
                  overrides: Optional[Mapping[str, Any]] = None) -> "Config":
        """A config from nested dicts ({"model": {"hidden": [64]}}) or dotted keys
        ({"model.hidden": [64]}), read as the same YAML would be; numpy scalars and arrays are
        taken as their values. Relative paths are relative to the working directory. A config
        that names no data (no ``data.dataset`` nor ``data.path``) is one for datasets the
        program passes to :class:`Trainer`: ``data.dataset`` is ``given``."""
        nested = _nest(values)
        data = nested.get("data")
        if not any(key in _nest(overrides or {}).get("data", {}) for key in ("dataset", "path")) \
                and not (isinstance(data, Mapping) and ("dataset" in data or "path" in data)):
            nested.setdefault("data", {})
            if isinstance(nested["data"], dict):
                nested["data"]["dataset"] = "given"
        text = json.dumps(nested, indent=2, default=_json_value)  # JSON is YAML
        try:
            return cls(_lockstep._parse_config(text, "Config.from_dict", _overrides(overrides)))
        except ConfigError as e:
            # The YAML reader names places by line and column of the JSON text made here, which
            # the caller never saw: each message names its key, which is what the caller wrote.
            raise ConfigError(re.sub(r"^Config\.from_dict:\d+:\d+: ", "Config.from_dict: ",
                                     str(e), flags=re.M)) from None

    def to_dict(self) -> dict[str, Any]:
        """Every key with its value (defaults included), as nested dicts."""
        return self._native.to_dict()

    def to_yaml(self) -> str:
        """YAML that from_yaml() reads back to the same config (``lockstep config --print``)."""
        return self._native.to_yaml()

    def __getitem__(self, key: str) -> Any:
        """A value by dotted key: ``config["optimizer.lr"]``."""
        node: Any = self.to_dict()
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise KeyError(key)
            node = node[part]
        return node

    def __repr__(self) -> str:
        return f"lockstep.Config({self.to_dict()!r})"


# ---- data ---------------------------------------------------------------------------------

class Dataset:
    """Samples the trainer reads: features and targets per sample."""

    def __init__(self, native: _lockstep._Dataset, copied: bool = False):
        self._native = native
        #: Whether making the dataset copied the arrays (they lacked the layout it reads).
        self.copied = copied

    def __len__(self) -> int:
        return self._native.size

    @property
    def features(self) -> int:
        return self._native.features

    @property
    def classes(self) -> int:
        """Classes, or a language model's vocabulary size."""
        return self._native.classes

    @property
    def targets(self) -> int:
        """Labels per sample: 1, or a language model's context."""
        return self._native.targets

    def sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample ``index`` as the trainer reads it: (float32 features, int32 targets)."""
        return self._native.sample(index)

    def __repr__(self) -> str:
        return (f"lockstep.{type(self).__name__}(samples={len(self)}, features={self.features}, "
                f"classes={self.classes})")


def _as(array: Any, dtype: Any, ndim: int, name: str) -> tuple[np.ndarray, bool]:
    """``array`` C-contiguous with ``dtype``, and whether that took a copy."""
    a = np.asarray(array)
    if a.ndim != ndim:
        raise InputError(f"{name}: expected a {ndim}-d array, got shape {a.shape}")
    out = np.ascontiguousarray(a, dtype=dtype)
    return out, not np.shares_memory(out, a) if out.size else False


class InMemoryDataset(Dataset):
    """Classification samples from numpy: ``x`` (samples, features), ``y`` (samples,) class ids
    in [0, classes). Borrowed without a copy when x is C-contiguous float32 and y int32."""

    def __init__(self, x: Any, y: Any, classes: Optional[int] = None):
        xa, x_copied = _as(x, np.float32, 2, "x")
        ya, y_copied = _as(y, None, 1, "y")
        if len(xa) != len(ya):
            raise InputError(f"x has {len(xa)} samples (rows), y has {len(ya)} labels: expected "
                             f"one label per row of x")
        if not np.issubdtype(ya.dtype, np.integer):
            raise InputError(f"y: expected integer class ids, got dtype {ya.dtype}")
        if ya.dtype != np.int32:
            if ya.size and (ya.min() < 0 or ya.max() > np.iinfo(np.int32).max):
                raise InputError(f"y: class ids must lie in [0, 2^31), got [{ya.min()}, {ya.max()}]")
            ya, y_copied = ya.astype(np.int32), True
        if classes is None:
            classes = int(ya.max()) + 1 if ya.size else 1
        super().__init__(_lockstep._in_memory(xa, ya, int(classes)), x_copied or y_copied)


class TokenDataset(Dataset):
    """A language model's token stream, cut into windows of ``context`` + 1 tokens, as
    ``lockstep train`` cuts a token file. Borrowed without a copy when ``tokens`` is a
    C-contiguous uint16 or uint32 array."""

    def __init__(self, tokens: Any, context: int, vocab_size: Optional[int] = None):
        a = np.asarray(tokens)
        if a.ndim != 1:
            raise InputError(f"tokens: expected a 1-d array, got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"tokens: expected integer token ids, got dtype {a.dtype}")
        if a.dtype in (np.uint16, np.uint32):
            t = np.ascontiguousarray(a)
        else:
            if a.size and (a.min() < 0 or a.max() > np.iinfo(np.uint32).max):
                raise InputError(f"tokens: ids must lie in [0, 2^32), got [{a.min()}, {a.max()}]")
            t = np.ascontiguousarray(a, dtype=np.uint32)
        if vocab_size is None:
            vocab_size = int(t.max()) + 1 if t.size else 1
        copied = not np.shares_memory(t, a) if t.size else False
        super().__init__(_lockstep._tokens(t, int(context), int(vocab_size)), copied)


def load_dataset(config: Config) -> tuple[Dataset, Dataset]:
    """The (train, eval) split of the data ``config``'s ``data`` section names, as
    ``lockstep train`` loads it (eval may be empty)."""
    train, eval_ = _lockstep._load_dataset(config._native)
    return Dataset(train), Dataset(eval_)


# ---- metrics and summary ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepMetrics:
    """Averaged over every worker and the log window (``trainer.log_every`` steps)."""
    step: int
    total_steps: int
    epoch: int
    loss: float
    accuracy: float
    lr: float
    grad_norm: float
    samples_per_s: float
    tokens_per_s: float
    mfu: float
    elapsed_s: float
    comm_hidden_fraction: float
    data_wait_s: float


@dataclasses.dataclass(frozen=True)
class EvalMetrics:
    step: int
    loss: float
    accuracy: float
    samples: int


class Summary:
    """What a run did: the fields of ``lockstep train --summary-json``, as attributes."""

    def __init__(self, values: dict[str, Any]):
        self._values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __dir__(self) -> Iterable[str]:
        return list(super().__dir__()) + list(self._values)

    def to_dict(self) -> dict[str, Any]:
        """The summary as --summary-json writes it (a copy)."""
        return json.loads(json.dumps(self._values))

    def __repr__(self) -> str:
        v = self._values
        return (f"lockstep.Summary(steps={v['steps']}, samples_per_s={v['samples_per_s']:.1f}, "
                f"final_train_loss={v['final_train_loss']:.4f}, param_hash={v['param_hash']!r})")


# ---- the trainer --------------------------------------------------------------------------

class Trainer:
    """The data-parallel trainer of ``config`` on ``train`` (and ``eval``), or, when ``train``
    is None, on the data the config names (:func:`load_dataset`).

    Callbacks run on worker 0's thread with the interpreter's lock held, between that worker's
    steps: keep them cheap. One that raises stops the run cleanly (a checkpoint when
    trainer.checkpoint.dir is set), and run() raises its exception.
    """

    def __init__(self, config: Config, train: Optional[Dataset] = None,
                 eval: Optional[Dataset] = None):
        self.config = config
        self._native = _lockstep._Trainer(config._native, train._native if train else None,
                                          eval._native if eval else None)
        self._keep = (train, eval)

    def on_step(self, fn: Optional[Callable[[StepMetrics], Any]]) -> None:
        """Every ``trainer.log_every`` steps and at the last, with :class:`StepMetrics`."""
        self._native.on_step(None if fn is None else lambda m: fn(StepMetrics(**m)))

    def on_eval(self, fn: Optional[Callable[[EvalMetrics], Any]]) -> None:
        """After each evaluation (``trainer.eval_every``), with :class:`EvalMetrics`."""
        self._native.on_eval(None if fn is None else lambda m: fn(EvalMetrics(**m)))

    def on_checkpoint(self, fn: Optional[Callable[[int, str], Any]]) -> None:
        """After each checkpoint is written, with its step and weights file."""
        self._native.on_checkpoint(
            None if fn is None else lambda m: fn(m["step"], m["weights_file"]))

    def request_stop(self) -> None:
        """Stops the run after the current step (the workers agree on which), writing a
        checkpoint when trainer.checkpoint.dir is set. Safe from any thread and callback."""
        self._native.request_stop()

    def resume(self, path: PathLike) -> int:
        """Continues from a checkpoint (a file, or the newest in a directory) exactly, as
        ``lockstep train --resume`` does; returns its step."""
        return self._native.resume(os.fspath(path))

    def init_from(self, path: PathLike) -> None:
        """Starts from the weights at ``path`` (a checkpoint, a safetensors file or a Hugging
        Face GPT-2 directory) with a fresh optimiser, as ``--init-from`` does."""
        self._native.init_from(os.fspath(path))

    @property
    def total_steps(self) -> int:
        return self._native.total_steps

    @property
    def model(self) -> str:
        """The model, as checkpoints record it ("mlp inputs=...")."""
        return self._native.model

    def memory_plan(self) -> str:
        return self._native.memory_plan()

    def run(self) -> Summary:
        """Trains; returns the :class:`Summary`. Raises WorkerError (with .rank and .device)
        when a worker fails, InputError for bad data, and a callback's or Ctrl-C's exception
        after the run has stopped for it."""
        return Summary(json.loads(self._native.run()))

    def parameters(self) -> dict[str, np.ndarray]:
        """The trained parameters by name (copies), after run()."""
        return self._native.parameters()


# ---- checkpoints --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as ``lockstep train`` writes it: tensors by name, and where training stood."""
    parameters: dict[str, np.ndarray]
    optimizer_state: dict[str, dict[str, np.ndarray]]
    metadata: dict[str, str]
    step: int
    epoch: int
    samples: int
    workers: int
    config: list[tuple[str, str]]
    weights_file: str


def load_checkpoint(path: PathLike) -> Checkpoint:
    """Reads a checkpoint: a weights file (or its .state), or the newest complete checkpoint in
    a directory. Damaged files raise InputError naming the file."""
    values = _lockstep._load_checkpoint(os.fspath(path))
    _warn_all(values)
    values["config"] = [tuple(kv) for kv in values["config"]]
    return Checkpoint(**values)


def _warn_all(values: dict[str, Any]) -> None:
    import warnings
    for w in values.pop("warnings"):
        warnings.warn(w, stacklevel=3)


# ---- sampling and export ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Sample:
    """What :func:`sample` drew. ``prompt_text + text`` is what ``lockstep sample`` prints."""
    prompt_tokens: list[int]
    tokens: list[int]
    prompt_text: str  # the prompt as given (a text model's), else its ids, spaced
    text: str         # the drawn tokens' text, or " <id>" each for a model without a tokenizer
    text_model: bool
    stopped: bool     # it drew a stop token (an end of sequence) before ``tokens``


def sample(checkpoint: PathLike, prompt: str = "", *, tokens: int = 200,
           temperature: float = 0.8, top_k: int = 0, seed: int = 0, backend: str = "auto",
           tokenizer: Optional[PathLike] = None, stop_at: Optional[Sequence[int]] = None,
           kv_cache: bool = True, allow_special: bool = False,
           on_token: Optional[Callable[[int, bytes], Any]] = None) -> Sample:
    """Continues ``prompt`` with a GPT checkpoint, as ``lockstep sample`` does (the same
    defaults, checks and draws: the same seed gives the same text). The text is decoded with
    the tokenizer the checkpoint records (or ``tokenizer``); a byte-level model's is its bytes.
    ``on_token(token: int, piece: bytes) -> None`` sees each token as it is drawn, with its
    bytes (a token may hold part of a UTF-8 character); what it returns is ignored. The
    interpreter's lock is released while the model runs. Sampling stops at the model's
    end-of-sequence ids (config.json's eos_token_id for a run begun from a Hugging Face
    directory, else the tokenizer's end token), or at ``stop_at`` (none when empty). Each token
    costs one position through a key/value cache; ``kv_cache=False`` runs the whole window per
    token instead (the same tokens, slower). ``allow_special=True`` encodes the text of the
    tokenizer's special tokens in the prompt ("<|im_start|>") as those tokens, as a chat
    template renders them (``lockstep sample --allow-special``); by default it is text."""
    request = _lockstep._SampleRequest()
    request.checkpoint = os.fspath(checkpoint)
    request.prompt = prompt
    request.tokens, request.temperature, request.top_k, request.seed = tokens, temperature, top_k, seed
    if tokenizer is not None:
        request.tokenizer = os.fspath(tokenizer)
    if stop_at is not None:
        request.stop_at = [int(t) for t in stop_at]
    request.kv_cache = bool(kv_cache)
    request.allow_special = bool(allow_special)
    values = _lockstep._sample(request, backend, on_token)
    _warn_all(values)
    for key in ("prompt_text", "text"):
        values[key] = values[key].decode("utf-8", errors="replace")
    return Sample(**values)


@dataclasses.dataclass(frozen=True)
class ExportResult:
    tensors: int
    parameters: int
    step: int


def export(checkpoint: PathLike, out: PathLike, *, format: str = "torch", dtype: str = "fp32",
           tokenizer: Optional[PathLike] = None, max_shard_size: str = "5GB") -> ExportResult:
    """Writes a checkpoint's weights for other tools, as ``lockstep export`` does: ``format``
    "torch" (a safetensors file with PyTorch's names) or "hf" (a Hugging Face directory, with
    the run's tokenizer, in shards above ``max_shard_size`` as transformers' save_pretrained
    cuts them), in ``dtype`` "fp32" or "bf16"."""
    values = _lockstep._export(os.fspath(checkpoint), os.fspath(out), format, dtype,
                               os.fspath(tokenizer) if tokenizer is not None else "",
                               max_shard_size)
    _warn_all(values)
    return ExportResult(**values)

"""Artificial textures on Gr(1, 3) (paper §5.1, Appendix Listing 1).

Each dataset is a 2-D point cloud ``p: (n, 2)`` lifted to lines through the origin of R^3:

1. ``p <- p / max_i ||p_i||``  (the max is taken **within the batch**, as in Listing 1),
2. ``y <- (1, p_x, p_y) / ||(1, p_x, p_y)||``.

So every representative lies in the open hemisphere ``y_1 >= 1/sqrt(2) > 0``, and ``[y]``
is the line spanned by ``y`` (drawn as the antipodal pair ``+-y`` on the sphere).

The batch-wise max norm means that the scale of a batch depends slightly on its size and
on its own outliers: a batch of 500 is on average squeezed a bit more than a batch of 50.
This is the paper's behaviour and is kept on purpose; compare sets of similar size (or
the fixed splits from `texture_splits`) when measuring distances between them.

Differences from Listing 1, none of which change the per-point distribution:

- swiss roll and circles are small numpy re-implementations (no scikit-learn);
- the circles in ``2circles`` and the ring in ``target`` use i.i.d. uniform angles
  instead of evenly spaced ones, so that a batch is an i.i.d. sample (needed by unbiased
  estimators such as `grassflow.metrics.mmd2`);
- every batch is shuffled (Listing 1 returns the spiral arms and the circles in blocks),
  and odd batch sizes are allowed.

References:
    Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation
    (NeurIPS 2023), §5.1 and Appendix Listing 1.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "TEXTURES",
    "TextureSampler",
    "lift_to_grassmann",
    "sample_texture",
    "sample_texture_2d",
    "texture_splits",
]

TEXTURES: tuple[str, ...] = ("2spirals", "swissroll", "2circles", "2sines", "target")

# spawn keys that keep the training stream and the held-out sets of one seed independent
_TRAIN, _VAL, _TEST = 0, 1, 2


# ------------------------------------------------------------------ 2-D clouds
def _two_spirals(rng: np.random.Generator, n: int) -> np.ndarray:
    n1 = n - n // 2
    t = np.sqrt(rng.random(n)) * 3.0 * np.pi  # 540 degrees
    arm = np.stack([-np.cos(t) * t, np.sin(t) * t], 1) + rng.random((n, 2)) * 0.1
    arm[n1:] *= -1.0  # second spiral = point reflection of the first
    return rng.permutation(arm) / 3.0 + rng.standard_normal((n, 2)) * 0.1


def _swiss_roll(rng: np.random.Generator, n: int) -> np.ndarray:
    # columns [0, 2] of sklearn's make_swiss_roll(noise=0.3), scaled by 1/5
    t = 1.5 * np.pi * (1.0 + 2.0 * rng.random(n))
    xy = np.stack([t * np.cos(t), t * np.sin(t)], 1) + rng.standard_normal((n, 2)) * 0.3
    return xy / 5.0


def _two_circles(rng: np.random.Generator, n: int) -> np.ndarray:
    # make_circles(factor=0.5, noise=0.05) * 3: n // 2 outer points, the rest inner
    radius = np.where(rng.permutation(n) < n // 2, 1.0, 0.5)
    angle = rng.random(n) * 2.0 * np.pi
    xy = radius[:, None] * np.stack([np.cos(angle), np.sin(angle)], 1)
    return (xy + rng.standard_normal((n, 2)) * 0.05) * 3.0


def _two_sines(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.random(n) - 0.5) * 2.0 * np.pi
    sign = rng.choice([-1.0, 1.0], size=n)
    xy = np.stack([x, sign * np.sin(x) * 2.5], 1)
    return xy + rng.standard_normal((n, 2)) * 0.1


def _target(rng: np.random.Generator, n: int) -> np.ndarray:
    # shapes 0-2: horizontal bars at y = -2, 0, 2; 3-5: vertical bars at x = -2, 0, 2;
    # 6: unit circle. Each shape is picked with probability 1/7.
    shape = rng.integers(7, size=n)
    along = (rng.random(n) - 0.5) * 4.0
    offset = (shape % 3 - 1) * 2.0
    angle = rng.random(n) * 2.0 * np.pi
    horizontal, vertical, ring = shape < 3, (shape >= 3) & (shape < 6), shape == 6
    x = np.select([horizontal, vertical, ring], [along, offset, np.cos(angle)])
    y = np.select([horizontal, vertical, ring], [offset, along, np.sin(angle)])
    return np.stack([x, y], 1) + rng.standard_normal((n, 2)) * 0.1


_CLOUDS: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "2spirals": _two_spirals,
    "swissroll": _swiss_roll,
    "2circles": _two_circles,
    "2sines": _two_sines,
    "target": _target,
}


# ------------------------------------------------------------------ validation
def _check_name(name: str) -> None:
    if name not in _CLOUDS:
        raise ValueError(f"unknown texture {name!r}; valid names are {', '.join(TEXTURES)}")


def _check_n(n: int, what: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return int(n)


def _make_rng(
    seed: int | np.random.SeedSequence | None, generator: np.random.Generator | None
) -> np.random.Generator:
    if generator is not None:
        if seed is not None:
            raise ValueError("pass either seed or generator, not both")
        if not isinstance(generator, np.random.Generator):
            raise ValueError(
                f"generator must be a numpy.random.Generator, got {type(generator).__name__}"
            )
        return generator
    return np.random.default_rng(seed)


# ------------------------------------------------------------------ public API
def sample_texture_2d(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """The raw planar cloud of texture ``name`` before lifting. Returns ``(n, 2)`` float64."""
    _check_name(name)
    return _CLOUDS[name](rng, _check_n(n))


def lift_to_grassmann(xy: np.ndarray) -> np.ndarray:
    """Listing 1's lift of a planar batch ``xy: (n, 2)`` to unit vectors ``(n, 3)``.

    Divides by the largest norm **in this batch**, prepends a 1 and normalizes, so the
    first coordinate is in ``[1/sqrt(2), 1]``.

    Raises:
        ValueError: ``xy`` is not a non-empty, finite real array of shape ``(n, 2)``.
    """
    xy = np.asarray(xy)
    if not (np.issubdtype(xy.dtype, np.floating) or np.issubdtype(xy.dtype, np.integer)):
        raise ValueError(f"xy must hold real numbers, got dtype {xy.dtype}")
    if xy.ndim != 2 or xy.shape[1] != 2 or xy.shape[0] == 0:
        raise ValueError(f"xy must have shape (n, 2) with n >= 1, got {xy.shape}")
    finite = np.isfinite(xy).all(axis=1)
    if not finite.all():
        raise ValueError(
            f"xy has {int((~finite).sum())} row(s) with NaN or inf (shape {xy.shape}), "
            f"first at row {int(finite.argmin())}"
        )
    scale = max(float(np.linalg.norm(xy, axis=1).max()), np.finfo(np.float64).tiny)
    y = np.concatenate([np.ones((len(xy), 1)), xy / scale], axis=1)
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def sample_texture(
    name: str,
    n: int,
    *,
    seed: int | np.random.SeedSequence | None = None,
    generator: np.random.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Draw one batch of a texture on Gr(1, 3).

    Args:
        name: one of `TEXTURES`.
        n: batch size (>= 1). The batch is normalized by its own max norm (module docs).
        seed: seed for a fresh ``numpy.random.Generator``; ``None`` for OS entropy.
        generator: an existing generator to draw from (advances it); excludes ``seed``.
        dtype: of the returned tensor (the math runs in float64).
        device: of the returned tensor.

    Returns:
        ``Y: (n, 3, 1)`` orthonormal representatives with ``Y[:, 0, 0] > 0``.
    """
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    rng = _make_rng(seed, generator)
    y = lift_to_grassmann(sample_texture_2d(name, n, rng))
    return torch.as_tensor(y, dtype=dtype, device=device).unsqueeze(-1)


def texture_splits(
    name: str,
    n_val: int = 500,
    n_test: int = 500,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Tensor]:
    """Fixed held-out sets for evaluation (training draws fresh batches instead).

    The sets come from their own random streams, independent of each other and of
    ``TextureSampler(name, seed)``'s training stream for the same seed. Each set is
    normalized by its own max norm, like one big batch.

    Returns:
        ``{"val": (n_val, 3, 1), "test": (n_test, 3, 1)}``.
    """
    _check_name(name)
    n_val, n_test = _check_n(n_val, "n_val"), _check_n(n_test, "n_test")
    out = {}
    for split, key, size in (("val", _VAL, n_val), ("test", _TEST, n_test)):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))
        out[split] = sample_texture(name, size, generator=rng, dtype=dtype)
    return out


class TextureSampler:
    """An infinite stream of fresh training batches (the paper never reuses data).

    Args:
        name: one of `TEXTURES`.
        seed: seed of the stream; ``None`` for OS entropy.
        dtype: of the returned batches.
        device: of the returned batches.

    Example:
        >>> sampler = TextureSampler("2spirals", seed=0)
        >>> Y = sampler.sample(256)            # (256, 3, 1)
        >>> state = sampler.state_dict()       # store in a checkpoint to resume the stream
    """

    def __init__(
        self,
        name: str,
        seed: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        _check_name(name)
        self.name, self.seed, self.dtype, self.device = name, seed, dtype, device
        self._rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_TRAIN,)))

    def __repr__(self) -> str:
        return f"TextureSampler(name={self.name!r}, seed={self.seed!r})"

    def sample(self, n: int) -> Tensor:
        """Next batch ``(n, 3, 1)``, normalized by its own max norm."""
        return sample_texture(
            self.name, n, generator=self._rng, dtype=self.dtype, device=self.device
        )

    def state_dict(self) -> dict:
        """The generator state, so that a resumed run continues the same stream."""
        return {"name": self.name, "bit_generator": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"state is for texture {state.get('name')!r}, not {self.name!r}")
        self._rng.bit_generator.state = state["bit_generator"]

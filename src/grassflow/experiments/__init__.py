"""The paper's experiments as functions the CLI calls; presets are dataclasses."""

from . import textures, textures_figures

__all__ = ["textures", "textures_figures"]

"""The agent's image, the real nodes' pause image and Argo Workflows' executor for them, built on
this machine (no registry)."""

from .builder import (
    Image,
    ImageError,
    build_agent_image,
    build_argoexec_image,
    build_pause_image,
    image_blocker,
    push,
)

__all__ = [
    "Image",
    "ImageError",
    "build_agent_image",
    "build_argoexec_image",
    "build_pause_image",
    "image_blocker",
    "push",
]

"""The agent's image and the real nodes' pause image, built on this machine (no registry)."""

from .builder import Image, ImageError, build_agent_image, build_pause_image, push

__all__ = ["Image", "ImageError", "build_agent_image", "build_pause_image", "push"]

"""``python -m cog_triton.settings > docs/settings.md``: the settings page, generated from the settings object."""

from cog_triton.settings import settings_markdown

print(settings_markdown(), end="")

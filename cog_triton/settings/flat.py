"""The flat-name source: each setting keeps its flat variable, ``COG_TRITON_<NAME>``, while the settings object
holds it in a group.

NAME is the field's ``validation_alias`` where it has one (``download_timeout_s``), else its name (``http_port``).

How a flat variable reaches its nested field: pydantic-settings reads the environment only into top-level fields,
so :meth:`cog_triton.settings.Settings.settings_customise_sources` gives it two :class:`FlatSource` instances
instead, one over the keywords (``Settings(http_port=...)``, flat names as before) and one over the environment,
each sorting the flat names into their groups (``{"triton": {"http_port": ...}}``); pydantic-settings then merges
them group by group (a keyword over a variable, field by field) and pydantic validates the groups. Keyed by field
names, a group's ``model_fields_set`` still means "set explicitly" (by a variable or a keyword). The other ways
were worse: ``env_nested_delimiter`` renames every variable (``COG_TRITON_DOWNLOAD__TIMEOUT_S``); groups that are
``BaseSettings`` themselves read the environment in their default factories, where a bad value fails alone and
without its group (several groups' errors are no longer reported together); regrouping in a
``model_validator(mode="before")`` comes after the merge, where ``weights``, both a group and COG_TRITON_WEIGHTS,
is one key: the weights from one source would replace the other source's whole group, or the other way round.

The functions take the settings class, whose fields are the groups (:class:`cog_triton.settings.Settings`).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Mapping

from pydantic import BaseModel
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from cog_triton.settings.base import ENV_PREFIX


def flat_name(name: str, field: Any) -> str:
    """A group's field's flat name: its validation alias, else its name (``COG_TRITON_`` + it upper-cased)."""
    return field.validation_alias if isinstance(field.validation_alias, str) else name


@functools.cache
def flat_names(settings_cls: type[BaseSettings]) -> dict[str, tuple[str, str]]:
    """Flat name -> (group, field) of ``settings_cls``, in the order of the groups and their fields."""
    return {flat_name(name, field): (group, name)
            for group, group_field in settings_cls.model_fields.items()
            for name, field in group_field.annotation.model_fields.items()}


def variable_at(settings_cls: type[BaseSettings], loc: tuple[str, ...]) -> str:
    """The environment variable of a validation error's location: (group, field name or alias), else the location
    itself (an unknown keyword)."""
    for flat, where in flat_names(settings_cls).items():
        if loc in (where, (where[0], flat)):
            return ENV_PREFIX + flat.upper()
    return ENV_PREFIX + ".".join(loc).upper()


def environment(settings_cls: type[BaseSettings]) -> dict[str, str]:
    """The settings' variables that are set, by flat name: as pydantic-settings' own source reads them (the prefix
    of ``env_prefix``, any case unless ``case_sensitive``, an empty one unset under ``env_ignore_empty``), plus
    Cog's COG_MAX_CONCURRENCY as ``max_concurrency`` unless ours is set (one source for the concurrency)."""
    config = settings_cls.model_config
    sensitive = config.get("case_sensitive", False)
    environ = dict(os.environ) if sensitive else {key.lower(): value for key, value in os.environ.items()}
    found = {}
    for flat in flat_names(settings_cls):
        name = config.get("env_prefix", "") + flat.upper()
        value = environ.get(name if sensitive else name.lower())
        if value is not None and not (value == "" and config.get("env_ignore_empty", False)):
            found[flat] = value
    if "max_concurrency" not in found and os.environ.get("COG_MAX_CONCURRENCY"):
        found["max_concurrency"] = os.environ["COG_MAX_CONCURRENCY"]
    return found


class FlatSource(PydanticBaseSettingsSource):
    """Settings by flat name (``http_port``, as COG_TRITON_HTTP_PORT), sorted into their groups
    (``{"triton": {"http_port": ...}}``) for pydantic-settings to merge group by group.

    A key that is no flat name passes as it is: a whole group (a dict or a model) or an unknown keyword, which
    validation refuses. ``weights`` is both a group and COG_TRITON_WEIGHTS: a dict or a model given for it is the
    group, anything else the variable. Flat names are matched in any case, as pydantic-settings matches keywords.
    """

    def __init__(self, settings_cls: type[BaseSettings], flat: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self.flat = dict(flat)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        """Unused: :meth:`__call__` gives all the values at once."""
        return None, field_name, False

    def _is_flat(self, key: str, value: object) -> bool:
        if key in self.settings_cls.model_fields and isinstance(value, (dict, BaseModel)):
            return False
        return key.lower() in flat_names(self.settings_cls)

    def __call__(self) -> dict[str, Any]:
        grouped = {key: value for key, value in self.flat.items() if not self._is_flat(key, value)}
        for key, value in self.flat.items():
            if self._is_flat(key, value):
                group, name = flat_names(self.settings_cls)[key.lower()]
                given = grouped.get(group)
                given = given.model_dump(exclude_unset=True) if isinstance(given, BaseModel) else given or {}
                grouped[group] = {**given, name: value}
        return grouped

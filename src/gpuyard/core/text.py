"""Text the store can keep: PostgreSQL refuses the NUL character in text (SQLite would
keep it), so input holding one is refused up front, the same on every backend."""

from __future__ import annotations

NUL = "\x00"


def nul_path(value: object) -> str | None:
    """Where a NUL character is in a JSON value (strings, list items, object keys and
    values): a path like ``ports[0].description``, ``""`` for the value itself, or None
    when there is none. Iterative, so any depth a JSON parser accepted is fine."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                shown = str(key).replace(NUL, "\\u0000")  # the path is shown to users
                child_path = f"{path}.{shown}" if path else shown
                if isinstance(key, str) and NUL in key:
                    return child_path
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
    return None


def refuse_nul(data: object) -> object:
    """``data`` unchanged, or ValueError naming where a NUL character is (for a model
    validator: the API answers it as a validation error on the body)."""
    where = nul_path(data)
    if where is not None:
        raise ValueError(f"{where or 'body'}: must not contain NUL (\\u0000) characters")
    return data

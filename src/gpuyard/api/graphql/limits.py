"""Limits against abusive documents, and the cache of parsed, validated documents.

Token count is enforced by the parser (``max_tokens``), depth and aliases by
validation rules, introspection by graphql-core's ``NoSchemaIntrospectionCustomRule``
when disabled; batch size and query length by the endpoint. A document is parsed and
validated once per distinct query text: the result (the document or its errors) is
kept in a bounded LRU cache, so a repeated query costs only its execution.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphql import (
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    parse,
    specified_rules,
    validate,
)
from graphql.validation import NoSchemaIntrospectionCustomRule

from gpuyard.api.graphql.errors import limit_error
from gpuyard.api.graphql.settings import GraphQLSettings


def _depth(
    selection_set: SelectionSetNode | None,
    fragments: dict[str, FragmentDefinitionNode],
    visiting: frozenset[str],
) -> int:
    """Deepest chain of fields under ``selection_set`` (fragments inlined, cycles cut:
    another rule reports them)."""
    if selection_set is None:
        return 0
    deepest = 0
    for sel in selection_set.selections:
        if isinstance(sel, FieldNode):
            deepest = max(deepest, 1 + _depth(sel.selection_set, fragments, visiting))
        elif isinstance(sel, InlineFragmentNode):
            deepest = max(deepest, _depth(sel.selection_set, fragments, visiting))
        elif isinstance(sel, FragmentSpreadNode):
            name = sel.name.value
            fragment = fragments.get(name)
            if fragment is not None and name not in visiting:
                deepest = max(deepest, _depth(fragment.selection_set, fragments, visiting | {name}))
    return deepest


def depth_rule(max_depth: int) -> type[ASTValidationRule]:
    """A rule refusing operations whose fields nest deeper than ``max_depth``."""

    class MaxDepthRule(ASTValidationRule):
        def enter_operation_definition(self, node: OperationDefinitionNode, *_: Any) -> None:
            doc = self.context.document
            fragments = {
                d.name.value: d for d in doc.definitions if isinstance(d, FragmentDefinitionNode)
            }
            depth = _depth(node.selection_set, fragments, frozenset())
            if depth > max_depth:
                name = node.name.value if node.name else "anonymous"
                self.report_error(
                    limit_error(
                        f"operation '{name}' is {depth} levels deep; the limit is {max_depth}",
                        "depth",
                        max_depth,
                    )
                )

    return MaxDepthRule


def alias_rule(max_aliases: int) -> type[ASTValidationRule]:
    """A rule refusing documents with more than ``max_aliases`` aliased fields."""

    class MaxAliasesRule(ASTValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            self.count = 0

        def enter_field(self, node: FieldNode, *_: Any) -> None:
            if node.alias is not None:
                self.count += 1

        def leave_document(self, *_: Any) -> None:
            if self.count > max_aliases:
                self.report_error(
                    limit_error(
                        f"the document has {self.count} aliases; the limit is {max_aliases}",
                        "aliases",
                        max_aliases,
                    )
                )

    return MaxAliasesRule


def rules_for(settings: GraphQLSettings) -> tuple[type[ASTValidationRule], ...]:
    """The standard rules plus this server's limits."""
    rules: list[type[ASTValidationRule]] = [
        *specified_rules,
        depth_rule(settings.max_depth),
        alias_rule(settings.max_aliases),
    ]
    if not settings.introspection:
        rules.append(NoSchemaIntrospectionCustomRule)
    return tuple(rules)


@dataclass(frozen=True)
class Prepared:
    """A query text after parsing and validation: the document, or why it is refused."""

    document: DocumentNode | None
    errors: Sequence[GraphQLError]


class DocumentCache:
    """Parsed and validated documents by query text, bounded LRU, thread-safe.

    Guarantees: a document handed out passed every rule of ``rules_for(settings)``;
    parsing and validating happen outside the lock (two threads may both prepare the
    same new text; one result wins, both are correct).
    """

    def __init__(self, schema: GraphQLSchema, settings: GraphQLSettings) -> None:
        self.schema = schema
        self.settings = settings
        self.rules = rules_for(settings)
        self._entries: OrderedDict[str, Prepared] = OrderedDict()
        self._lock = threading.Lock()

    def prepare(self, query: str) -> Prepared:
        size = self.settings.document_cache_size
        if size:
            with self._lock:
                hit = self._entries.get(query)
                if hit is not None:
                    self._entries.move_to_end(query)
                    return hit
        prepared = self._prepare(query)
        if size:
            with self._lock:
                self._entries[query] = prepared
                while len(self._entries) > size:
                    self._entries.popitem(last=False)
        return prepared

    def _prepare(self, query: str) -> Prepared:
        try:
            document = parse(query, max_tokens=self.settings.max_tokens)
        except GraphQLError as exc:
            if "tokens. Parsing aborted" in exc.message:
                exc = limit_error(
                    f"the document has more than {self.settings.max_tokens} tokens",
                    "tokens",
                    self.settings.max_tokens,
                )
            return Prepared(None, [exc])
        errors = validate(self.schema, document, self.rules)
        return Prepared(None, errors) if errors else Prepared(document, ())

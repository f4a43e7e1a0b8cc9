"""The topic exchange: binding keys are dot-separated word patterns with "*" and "#".

Theory of operation: as in RabbitMQ (rabbit_db_topic_exchange), the binding keys form a trie
of words, one edge per word, and each node holds the bindings whose key ends there. RabbitMQ
matches by recursive descent, trying for each routing-key word the literal edge, the "*" edge
and, for "#", every possible number of skipped words; with several "#" in a row that search
branches once per skip and is exponential in the worst case. Here the same trie is walked
as a nondeterministic automaton instead: the state is the list of trie nodes reachable after
the words read so far (each node at most once), a "#" node may stay put on any word, and a
"#" edge may be taken without reading a word. Each word costs at most one step per reachable
node, so a match is O(words x nodes) however the patterns are written, with no cache.

Words are what RabbitMQ's split_topic_key / split_topic_key_binary produce: the key split on
every "." with empty words kept ("a..b" is ["a", "", "b"], "a." is ["a", ""]), except that the
empty key "" is NO words at all, not one empty word. So "*" (exactly one word) does not match
"", while "#", "#.#" and the binding key "" do (RabbitMQ's routing_SUITE topic test: routing
key "" matches only "#", "#.#", "#.#.#" and ""). Routing-key words are not special: a key
word "*" or "#" is matched like any other word.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Binding, BindingIdentity, Router, distinct_destinations

_STAR = "*"
_HASH = "#"


def split_words(key: str) -> list[str]:
    """RabbitMQ's split_topic_key: "" has no words; otherwise split on every ".", keeping
    empty words."""
    if not key:
        return []
    return key.split(".")


class _Node:
    __slots__ = ("children", "bindings", "is_hash")

    def __init__(self, is_hash: bool) -> None:
        # Word -> child; a dict so that iteration (in check_invariants) is in insertion order.
        self.children: dict[str, _Node] = {}
        # The bindings whose key ends at this node, in insertion (= sequence) order.
        self.bindings: dict[BindingIdentity, Binding] = {}
        # Reached through a "#" edge: this node may consume any number of further words.
        self.is_hash = is_hash


class TopicRouter(Router):
    exchange_type = "topic"

    def __init__(self) -> None:
        super().__init__()
        self._root = _Node(is_hash=False)

    def route(self, routing_key: str, headers: Mapping[str, object] | None = None) -> list[str]:
        if not self._bindings:
            return []
        active = _hash_closure({id(self._root): self._root})
        for word in split_words(routing_key):
            step: dict[int, _Node] = {}
            for node in active.values():
                if node.is_hash:
                    # "#" absorbs this word too.
                    step[id(node)] = node
                child = node.children.get(word)
                if child is not None:
                    step[id(child)] = child
                child = node.children.get(_STAR)
                if child is not None:
                    step[id(child)] = child
            if not step:
                return []
            active = _hash_closure(step)
        matched = [b for node in active.values() for b in node.bindings.values()]
        if not matched:
            return []
        # Nodes are visited in trie order; the answer is in binding order.
        matched.sort(key=_seq_of)
        return distinct_destinations(matched)

    def _index_add(self, binding: Binding) -> None:
        node = self._root
        for word in split_words(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = _Node(is_hash=word == _HASH)
                node.children[word] = child
            node = child
        node.bindings[binding.identity] = binding

    def _index_remove(self, binding: Binding) -> None:
        # Walk down remembering the path, then prune nodes left with neither bindings nor
        # children, as RabbitMQ's remove_path_if_empty does, so the trie only holds live keys.
        path: list[tuple[_Node, str]] = []
        node = self._root
        for word in split_words(binding.routing_key):
            path.append((node, word))
            node = node.children[word]
        del node.bindings[binding.identity]
        for parent, word in reversed(path):
            child = parent.children[word]
            if child.bindings or child.children:
                break
            del parent.children[word]

    def _check_index(self) -> None:
        count = 0
        # Explicit stack (no recursion): keys are at most 256 words (shortstr), but be safe.
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, words = stack.pop()
            if node is not self._root:
                assert node.bindings or node.children, f"unpruned node at {'.'.join(words)!r}"
                assert node.is_hash == (words[-1] == _HASH)
            for identity, binding in node.bindings.items():
                assert self._bindings.get(identity) is binding
                assert split_words(binding.routing_key) == words
                count += 1
            for word, child in node.children.items():
                stack.append((child, words + [word]))
        assert count == len(self._bindings)


def _hash_closure(nodes: dict[int, _Node]) -> dict[int, _Node]:
    """Add every node reachable through "#" edges without reading a word ("#" matches zero
    words). Keyed by id() only for de-duplication; iteration is insertion order."""
    frontier = list(nodes.values())
    while frontier:
        node = frontier.pop()
        child = node.children.get(_HASH)
        if child is not None and id(child) not in nodes:
            nodes[id(child)] = child
            frontier.append(child)
    return nodes


def _seq_of(binding: Binding) -> int:
    return binding.seq

"""RadixTree: a token-granular radix tree whose nodes own KV blocks of the paged pool.

A node spans tokens ``[start, end)`` of every sequence whose path runs through it; ``blocks[j]`` is the block
holding positions of block index ``start // block_size + j`` (slot ``position % block_size``). A node of a
windowed KV group may hold None for a block index before the window of the sequence that inserted it (that
block was given back); a windowed match reads only the blocks inside its window. The invariant
that makes token-granular reuse safe: a node's block for index ``i`` holds valid KV for every position of block
``i`` from ``i * block_size`` up to ``min(end, (i + 1) * block_size)`` along the node's path. When a split
falls inside a block, the parent's last block and the child's first block are the same block.

Nodes are locked (``lock_ref``) by live sequences whose path runs through them; only unlocked leaves are
evicted, least recently used first, through a heap with lazy deletion.
"""

from __future__ import annotations

import heapq
import itertools

from frame_cache_radix.pool import RefPool


class Node:
    """One edge of the tree: its tokens, their blocks and its place in the tree."""

    __slots__ = ("alive", "blocks", "children", "key", "last_access", "lock_ref", "parent", "start", "tokens")

    def __init__(self, tokens: list[int], start: int, blocks: list[int | None], parent: Node | None,
                 key: tuple[str, ...] = ()) -> None:
        self.tokens, self.start, self.blocks, self.parent, self.key = tokens, start, blocks, parent, key
        self.children: dict[int, Node] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.alive = True

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def evictable(self) -> bool:
        return self.parent is not None and self.alive and not self.children and not self.lock_ref


def _common_prefix(a: list[int], b: list[int], b_start: int, b_stop: int) -> int:
    count = min(len(a), b_stop - b_start)
    if a[:count] == b[b_start:b_start + count]:
        return count
    i = 0
    while a[i] == b[b_start + i]:
        i += 1
    return i


class RadixTree:
    """One root per tuple of extra keys (so tenants never share), nodes over a :class:`RefPool`."""

    def __init__(self, pool: RefPool, block_size: int) -> None:
        self.pool, self.block_size = pool, block_size
        self.roots: dict[tuple[str, ...], Node] = {}
        self.num_nodes = 0
        self._clock = 0
        self._heap: list[tuple[int, int, Node]] = []
        self._serial = itertools.count()

    # -- queries -----------------------------------------------------------------------------------------
    def match(self, keys: tuple[str, ...], tokens: list[int], limit: int) -> tuple[int, Node | None]:
        """Longest prefix of ``tokens[:limit]`` in the tree: (its length, the deepest node it reaches)."""
        node = self.roots.get(keys)
        pos, last = 0, None
        while node is not None and pos < limit:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            count = _common_prefix(child.tokens, tokens, pos, limit)
            pos, last = pos + count, child
            node = child if count == len(child.tokens) else None
        return pos, last

    def path(self, node: Node | None) -> list[Node]:
        """The nodes from the root's child down to ``node``."""
        nodes = []
        while node is not None and node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def path_blocks(self, node: Node | None, num_tokens: int) -> tuple[list[int | None], set[int]]:
        """For the first ``num_tokens`` tokens of ``node``'s path: the block holding each block index (from the
        deepest node that reaches into it) and every block the path's nodes reference there."""
        owners: list[int | None] = []
        referenced: set[int] = set()
        for n in self.path(node):
            first = n.start // self.block_size
            for j, block in enumerate(n.blocks):
                index = first + j
                if index * self.block_size >= num_tokens:
                    break
                if block is not None:
                    referenced.add(block)
                if index < len(owners):
                    owners[index] = block
                else:
                    owners.append(block)
        return owners, referenced

    # -- structure -----------------------------------------------------------------------------------------
    def split(self, node: Node, count: int) -> Node:
        """Split ``node`` after its first ``count`` tokens; returns the new parent (head), ``node`` keeps the tail.

        ``node`` stays the deeper part so that a sequence locked down to it keeps covering the whole span.
        """
        size, start = self.block_size, node.start
        head_blocks = (start + count - 1) // size - start // size + 1
        tail_first = (start + count) // size - start // size
        head = Node(node.tokens[:count], start, node.blocks[:head_blocks], node.parent, node.key)
        head.lock_ref, head.last_access = node.lock_ref, node.last_access
        if tail_first < head_blocks:  # the split falls inside a block, which both halves now reference
            self.pool.adjust(node.blocks[tail_first], node=1, pin=1 if node.lock_ref else 0)
        node.parent.children[node.tokens[0]] = head  # type: ignore[union-attr]
        node.tokens, node.start, node.blocks = node.tokens[count:], start + count, node.blocks[tail_first:]
        head.children[node.tokens[0]] = node
        node.parent = head
        self.num_nodes += 1
        return head

    def insert(self, keys: tuple[str, ...], tokens: list[int], num_tokens: int, table: list[int | None],
               owned: Node | None, extend: bool = True) -> Node:
        """Add ``tokens[:num_tokens]`` (KV in ``table``) below ``owned``, the deepest node of the caller's path
        (which covers ``tokens[:owned.end]``; None: start at the root). Returns the node ending at
        ``num_tokens``. Parts already in the tree keep their blocks; the caller's duplicates are not used.

        ``owned`` is extended in place when only the caller locks it, it is a leaf and it ends on a block
        boundary, which keeps one sequence's path a single node; ``extend=False`` adds a new leaf instead (blocks
        that must stay evictable while the caller's lock holds ``owned``).
        """
        node = owned if owned is not None else self._root(keys)
        pos = node.end
        while pos < num_tokens:
            child = node.children.get(tokens[pos])
            if child is None:
                return self._grow(node, extend and node is owned, tokens[pos:num_tokens], table)
            count = _common_prefix(child.tokens, tokens, pos, num_tokens)
            if count < len(child.tokens):
                child = self.split(child, count)
            node, pos = child, pos + count
            self.touch(node)
        return node

    def _grow(self, node: Node, owned: bool, tokens: list[int], table: list[int | None]) -> Node:
        size, start = self.block_size, node.end
        first, last = start // size, (start + len(tokens) - 1) // size
        if owned and node.lock_ref == 1 and not node.children and start % size == 0:
            node.tokens.extend(tokens)
            added = table[first:last + 1]
            node.blocks.extend(added)
            for block in added:
                self.pool.adjust(block, node=1, pin=1)
            self.touch(node)
            return node
        leaf = Node(list(tokens), start, table[first:last + 1], node, node.key)
        for block in leaf.blocks:
            self.pool.adjust(block, node=1)
        node.children[tokens[0]] = leaf
        self.num_nodes += 1
        self.touch(leaf)
        return leaf

    def _root(self, keys: tuple[str, ...]) -> Node:
        root = self.roots.get(keys)
        if root is None:
            root = self.roots[keys] = Node([], 0, [], None, keys)
        return root

    # -- locking and LRU ------------------------------------------------------------------------------------
    def touch(self, node: Node) -> None:
        self._clock += 1
        node.last_access = self._clock
        self._candidate(node)

    def _candidate(self, node: Node) -> None:
        """Offer ``node`` to the eviction heap if it is an unlocked leaf; drop stale entries now and then."""
        if node.evictable:
            heapq.heappush(self._heap, (node.last_access, next(self._serial), node))
            if len(self._heap) > 2 * self.num_nodes + 64:
                self._heap = [(n.last_access, next(self._serial), n) for n in self.nodes() if n.evictable]
                heapq.heapify(self._heap)

    def lock(self, node: Node | None) -> None:
        """Protect ``node`` and its ancestors from eviction (one more live sequence runs through them)."""
        for n in self.path(node):
            n.lock_ref += 1
            if n.lock_ref == 1:
                for block in n.blocks:
                    self.pool.adjust(block, pin=1)
            self.touch(n)

    def unlock(self, node: Node | None) -> None:
        """Undo one :meth:`lock`; nodes that no sequence runs through become evictable when they are leaves."""
        for n in reversed(self.path(node)):
            n.lock_ref -= 1
            if n.lock_ref == 0:
                for block in n.blocks:
                    self.pool.adjust(block, pin=-1)
            self.touch(n)

    def evict(self, num_empty: int) -> int:
        """Evict unlocked leaves, least recently used first, until ``num_empty`` blocks are empty.

        Returns the number of blocks that evictions freed.
        """
        freed = 0
        while self.pool.num_empty < num_empty:
            if not self._heap:
                raise RuntimeError("the radix tree has no evictable leaf left; the capacity check is wrong")
            access, _, node = heapq.heappop(self._heap)
            if node.evictable and node.last_access == access:
                freed += self._remove(node)
        return freed

    def _remove(self, node: Node) -> int:
        freed = sum(self.pool.adjust(block, node=-1) for block in node.blocks)
        parent = node.parent
        del parent.children[node.tokens[0]]  # type: ignore[union-attr]
        node.alive, node.parent = False, None
        self.num_nodes -= 1
        if parent.parent is None and not parent.children:  # type: ignore[union-attr]
            del self.roots[parent.key]  # type: ignore[union-attr]
        else:
            self._candidate(parent)  # type: ignore[arg-type]
        return freed

    def nodes(self) -> list[Node]:
        """Every node but the roots, parents before children."""
        out: list[Node] = []
        stack = [child for root in self.roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def clear(self) -> None:
        """Drop every node (the caller checked none is locked); their blocks lose the tree's references."""
        for node in self.nodes():
            for block in node.blocks:
                self.pool.adjust(block, node=-1)
            node.alive, node.parent = False, None
        self.roots.clear()
        self._heap.clear()
        self.num_nodes = 0

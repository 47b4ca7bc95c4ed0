r"""Equivalent sides of a bond graph: the symmetries `build_zmatrix` swaps (issue 46).

Two neighbours a, b of an atom j are equivalent when the bonds j-a and j-b are bridges and
the sides hanging off them (the atoms reachable from a without passing j, and likewise b)
are the same rooted tree with atomic numbers as labels. A rooted tree's canonical string
(Aho, Hopcroft, Ullman) is ``(Z`` followed by its children's strings, sorted, and ``)``:
two rooted trees are isomorphic exactly when their strings are equal, and matching children
by string builds the isomorphism (`side_map`). Swapping two equivalent sides is then a graph
automorphism that fixes every other atom. Sides that hold a ring are not trees and are left
out (a phenyl's 180-degree flip is a symmetry of the graph these functions do not see).

Graphs are adjacency lists ``adj: list[list[int]]`` on atoms ``0..n-1``, ``Z`` their atomic
numbers.

References:
    Aho, Hopcroft, Ullman. The Design and Analysis of Computer Algorithms (1974), tree
    isomorphism.
"""

from __future__ import annotations

__all__ = ["check_automorphisms", "hanging_tree", "side_map", "sibling_groups", "tree_string"]


def hanging_tree(a: int, j: int, adj) -> list[int] | None:
    """The atoms reachable from a without passing j, in depth-first preorder, if they form a
    tree hanging off j by the bridge j-a; else None (j-a on a ring, or a ring in the side)."""
    order, parent, stack = [], {a: j}, [a]
    while stack:
        u = stack.pop()
        order.append(u)
        for v in adj[u]:
            if v == parent[u]:
                continue
            if v == j or v in parent:  # back to j (no bridge) or a cycle in the side
                return None
            parent[v] = u
            stack.append(v)
    return order


def tree_string(a: int, j: int, adj, Z) -> str | None:
    """The AHU string of the side of a seen from j (a rooted tree with atomic numbers), equal
    for two sides exactly when they are isomorphic rooted trees; None if not a tree."""
    order = hanging_tree(a, j, adj)
    if order is None:
        return None
    parent, code = {a: j}, {}
    for u in order:
        for v in adj[u]:
            if v != parent[u]:
                parent[v] = u
    for u in reversed(order):  # children before parents
        kids = sorted(code[v] for v in adj[u] if v != parent[u])
        code[u] = f"({Z[u]}{''.join(kids)})"
    return code[a]


def sibling_groups(rows, parent, adj, Z, sides: bool = True) -> dict[int, list[int]]:
    """The groups of equivalent siblings among ``rows``.

    Args:
        rows (list[int]): atoms in placement order.
        parent (dict[int, int]): each row atom's bond partner j (placed before it).
        adj, Z: the graph (see the module doc).
        sides: equivalent hanging trees; False: terminal hydrogens only.

    Returns:
        ``{i: group}`` for each row atom i with an equivalent sibling among the rows: the row
        atoms with i's parent and i's side, in placement order.
    """
    by_key: dict = {}
    for i in rows:
        if Z[i] == 1 and len(adj[i]) == 1:
            key = "(1)"  # a terminal hydrogen: a leaf side
        else:
            key = tree_string(i, parent[i], adj, Z) if sides else None
        if key is not None:
            by_key.setdefault((parent[i], key), []).append(i)
    return {i: g for g in by_key.values() if len(g) > 1 for i in g}


def side_map(a: int, b: int, j: int, adj, Z, order) -> list[tuple[int, int]]:
    """The pairs ``(u, sigma(u))`` of an isomorphism of a's side onto b's (both seen from j,
    equivalent): a to b, then children matched by canonical string, equal ones in their
    order in ``order`` (placement order), breadth-first."""
    position = {u: m for m, u in enumerate(order)}
    out, todo = [], [(a, b, j, j)]
    while todo:
        u, v, pu, pv = todo.pop(0)
        out.append((u, v))
        key = lambda x, p: (tree_string(x, p, adj, Z), position.get(x, -1))  # noqa: E731
        cu = sorted((x for x in adj[u] if x != pu), key=lambda x: key(x, u))
        cv = sorted((x for x in adj[v] if x != pv), key=lambda x: key(x, v))
        todo += [(x, y, u, v) for x, y in zip(cu, cv)]
    return out


def check_automorphisms(sides, adj, Z) -> None:
    """Raise RuntimeError (a bug in the caller, not bad input) unless each ``(A, B)`` of
    ``sides`` (atom tuples matched by position: the permutation exchanges ``A[m]`` and
    ``B[m]``) keeps the atomic numbers and maps every bond onto a bond."""
    for A, B in sides:
        sigma = dict(zip(A, B)) | dict(zip(B, A))
        s = lambda u: sigma.get(u, u)  # noqa: E731
        if any(Z[s(u)] != Z[u] for u in sigma) or any(
                s(v) not in adj[s(u)] for u in range(len(adj)) for v in adj[u]):  # fmt: skip
            raise RuntimeError(f"the swap of sides {(A, B)} is not an automorphism of the "
                               "bond graph (a bug in build_zmatrix)")  # fmt: skip

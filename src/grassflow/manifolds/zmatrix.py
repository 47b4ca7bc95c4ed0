r"""The Z-matrix of a molecule, from its bond graph alone.

A Z-matrix places the atoms one at a time: the first three fix a frame (``root``), then each
other atom ``i`` gets a bond length to ``j``, an angle ``i-j-k`` and a torsion ``i-j-k-l``,
with ``j, k, l`` placed before it. `build_zmatrix` chooses them by these rules:

* breadth-first from a heavy atom, heavy atoms before hydrogens among the neighbours; without
  rings the root is the heavy atom closest to all others in the graph (the shortest chains);
* ``j`` is a bonded atom placed before ``i`` (its breadth-first parent); ``k`` and ``l`` are
  the placed atoms nearest in the graph (``k`` to ``j``, ``l`` to ``k``), heavy atoms first;
* no two atoms share the same ``(j, k, l)``: two hydrogens on one carbon placed by the same
  three atoms would each get an independent torsion, and could land on each other. Every
  hydrogen on an atom after the first (every equivalent sibling, see below) takes the
  previous one as its torsion reference (``l`` = a sibling), so that its torsion is the
  stiff ~120° between the two.

Linear groups (``straight``): atoms on a straight line (a nitrile N#C-C, an alkyne
C-C#C-C, an allene's C=C=C, and atoms that line up with them such as benzonitrile's para
carbon) make no angle or torsion axis: the torsion about a straight angle is undefined and
``sin(theta) = 0`` in the volume. Given the data's straight triples (`straight`, found from
conformers by `grassflow.manifolds.internal.straight_angles`), three collinear atoms never
form the root, an angle ``i-j-k`` or a torsion axis with its reference ``j-k-l``: ``k`` is
then the nearest placed atom off the line through i and j (e.g. an ortho ring carbon for
benzonitrile's N, not bonded to j), and ``l`` the nearest one off the line through j and k
(but-2-yn-1-ol's methyl hydrogens take the O). A rod's bend is then two smooth coordinates
about a bent axis. A molecule without straight triples gets the same Z-matrix as without
the argument; a linear molecule (HC#CH, CO2) has no frame and is refused.

Equivalent siblings (``swaps``, ``swap_sides``): swapping the labels of two equivalent
groups on one atom is a symmetry of the molecule (the energy cannot tell), but conformers
generated from different embeddings come with either order, so the sign of the second
group's torsion about the first is a coin flip in the data: a joint that a flow learns
badly (it leaks mass between the signs, and the groups land on each other). Two neighbours
a, b of an atom j are equivalent when the bonds j-a and j-b are bridges and the sides
hanging off them (the atoms reachable from a without passing j, and likewise b) are the
same rooted tree with atomic numbers as labels (the same canonical string, AHU-style): two
hydrogens of a CH2 (leaf sides), the two methyls of an isopropyl group, the three of a
tert-butyl, the F's of CF3, the O's of a nitro group or carboxylate (bond orders are not
read: resonance makes those O's equal). Every equivalent sibling after the first placed as
a row takes the previous one as its torsion reference (``l``), so that its torsion is the
stiff ~120 degrees between the two; the first two such rows on j form a pair ``(a, b)`` of
`ZMatrix.swaps`, b's row ``(b, j, k, a)`` with k placed before, in neither side and not
collinear. `ZMatrix.swap_sides` holds, per pair, the atom permutation that maps a's side
onto b's (children matched by canonical string, equal ones in placement order) and back, a
graph automorphism that fixes j and k. Pairs are listed in placement order of b, so an
outer pair (an isopropyl's methyls) comes before the pairs inside its sides (each methyl's
hydrogens). A model may take b's torsion in ``(0, pi)`` and symmetrize over the swaps
(`grassflow.flows.InternalFlow`). Not symmetrized: sides that hold a ring (a phenyl's
180-degree flip, two rings on one atom: their sides are not trees), siblings of which one
is a root atom (glycerol's C1 and C3, the methyls of 2-methylpropan-1-ol, which depend on
the atom order), and the rest of a group of three or more (one pair per group, of the
group's 3! or more labellings). With ``sides=False`` only terminal hydrogens are siblings
(the rule before issue 46): a molecule whose only equivalent sides are single hydrogens
gets the same Z-matrix either way.

Rings: a ring-closing bond is not a coordinate of any Z-matrix, so small errors in the
ring's angles and torsions could add up around the ring and break it. By default the rows
of ring atoms are ordinary ones and the closing bonds implicit: a model that whitens its
coordinates holds them through their correlations (measured: issue 41). With
``cartesian_rings=True`` the atoms of every ring are instead placed as one Cartesian block, by
their coordinates in the frame of the three root atoms (which lie in a ring), as in
bgflow's mixed coordinates; every other atom hangs off them by a Z-matrix row. An atom
bonded to a ring atom j takes j's other ring neighbour as its torsion reference: its
torsion then says on which side of the ring it sits (an improper torsion of about ±120°),
not how the ring puckers.

References:
    Köhler, Krämer, Noé (bgflow): mixed internal/Cartesian coordinates of Boltzmann
    generators; Noé, Olsson, Köhler, Wu. Boltzmann generators. Science 365 (2019).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

from .graph_sides import check_automorphisms, side_map, sibling_groups

__all__ = ["ZMatrix", "build_zmatrix", "graph_distances", "ring_atoms", "ring_bonds"]


@dataclass(frozen=True)
class ZMatrix:
    """The placement of a molecule's atoms (indices into its atom order).

    Attributes:
        n_atoms: n.
        root: ``(a0, a1, a2)``: a0 at the origin, a1 on the frame's first axis (bonded to
            a0), a2 in its first plane; a2 is bonded to ``root_bond`` (a0 or a1) and makes
            its angle with the other.
        root_bond: a0 or a1, the atom a2 is bonded to.
        cartesian: atoms placed by their coordinates in the root frame (ring atoms).
        rows: ``(i, j, k, l)`` per other atom, in placement order: bond ``i-j``, angle
            ``i-j-k``, torsion ``i-j-k-l``.
        swaps: ``(a, b)`` per atom with two or more equivalent siblings placed as rows (see
            the module doc), in placement order of b (outer pairs first): b's row is
            ``(b, j, k, a)``.
        swap_sides: ``(A, B)`` per swap: a's side and b's side as atom tuples matched by
            position (``A[0] = a``, ``B[0] = b``); the swap's permutation exchanges ``A[m]``
            and ``B[m]`` and fixes every other atom. () (and in `to_dict`, left out when
            every swap is a pair of single atoms): ``((a,), (b,))`` each, as before issue 46.
        straight: ``(a, b, c)`` with ``a < c``: three collinear atoms, b between a and c
            (the angle a-b-c near 180 degrees in the data), that no angle and no torsion axis
            with its reference may be made of (see the module doc); () in `to_dict` is left
            out, so that a Z-matrix without them reads as before.
    """

    n_atoms: int
    root: tuple[int, int, int]
    root_bond: int
    cartesian: tuple[int, ...] = ()
    rows: tuple[tuple[int, int, int, int], ...] = ()
    swaps: tuple[tuple[int, int], ...] = ()
    straight: tuple[tuple[int, int, int], ...] = ()
    swap_sides: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()

    def __post_init__(self):  # JSON gives lists
        object.__setattr__(self, "root", tuple(int(a) for a in self.root))
        object.__setattr__(self, "cartesian", tuple(int(a) for a in self.cartesian))
        object.__setattr__(self, "rows", tuple(tuple(int(a) for a in r) for r in self.rows))
        object.__setattr__(self, "swaps", tuple((int(a), int(b)) for a, b in self.swaps))
        a0, a1, a2 = self.root
        if self.root_bond not in (a0, a1):
            raise ValueError(f"root_bond must be a0 or a1 of root {self.root}")
        order = self.order
        if sorted(order) != list(range(self.n_atoms)):
            raise ValueError(f"a Z-matrix must place each of the {self.n_atoms} atoms once, "
                             f"got the order {order}")  # fmt: skip
        placed = set(self.root) | set(self.cartesian)
        for i, j, k, l in self.rows:
            if len({i, j, k, l}) != 4 or not {j, k, l} <= placed:
                raise ValueError(f"row {(i, j, k, l)}: j, k, l must be distinct atoms placed "
                                 "before i")  # fmt: skip
            placed.add(i)
        row_of = {r[0]: r for r in self.rows}
        for a, b in self.swaps:
            if b not in row_of or row_of[b][3] != a:
                raise ValueError(f"swap {(a, b)}: b must have a row with torsion reference a")
        object.__setattr__(self, "swap_sides", self._check_sides(row_of))
        object.__setattr__(self, "straight", _straight(self.n_atoms, self.straight))
        line = {frozenset(t) for t in self.straight}
        root = (a2, self.root_bond, a1 if self.root_bond == a0 else a0)
        if frozenset(root) in line:
            raise ValueError(f"the root angle {_dash(root)} is straight (in straight)")
        for i, j, k, l in self.rows:
            for what, t in (("angle", (i, j, k)), ("torsion axis and reference", (j, k, l))):
                if frozenset(t) in line:
                    raise ValueError(f"row {(i, j, k, l)}: its {what} {_dash(t)} is straight "
                                     "(in straight)")  # fmt: skip

    def _check_sides(self, row_of) -> tuple:
        """`swap_sides` as tuples (leaf pairs where empty), refused unless each is an
        involution that exchanges a and b and fixes j and k of b's row, and no swap moves an
        atom of an earlier swap's torsion test ``(b, j, k, a)`` (the canonical order)."""
        sides = self.swap_sides or tuple(((a,), (b,)) for a, b in self.swaps)
        sides = tuple((tuple(int(v) for v in A), tuple(int(v) for v in B)) for A, B in sides)
        if len(sides) != len(self.swaps):
            raise ValueError(f"swap_sides must have one (A, B) per swap ({len(self.swaps)}), "
                             f"got {len(sides)}")  # fmt: skip
        for (a, b), (A, B) in zip(self.swaps, sides):
            moved = A + B
            if len(A) != len(B) or A[:1] != (a,) or B[:1] != (b,):
                raise ValueError(f"swap {(a, b)}: its sides must be two tuples of one length "
                                 f"starting with a and b, got {(A, B)}")  # fmt: skip
            if len(set(moved)) != len(moved) or not all(0 <= v < self.n_atoms for v in moved):
                raise ValueError(f"swap {(a, b)}: sides {(A, B)} must be distinct atoms in "
                                 f"0..{self.n_atoms - 1} (else the swap is no involution)")
            _, j, k, _ = row_of[b]
            if j in moved or k in moved:
                raise ValueError(f"swap {(a, b)}: its sides {(A, B)} must fix j={j} and k={k} "
                                 "of b's row (its torsion's axis)")  # fmt: skip
        for m, (A, B) in enumerate(sides):
            for a, b in self.swaps[:m]:
                hit = sorted(set(row_of[b]) & set(A + B))
                if hit:
                    raise ValueError(f"swap {self.swaps[m]} moves atoms {hit} of the torsion "
                                     f"{row_of[b]} of the earlier swap {(a, b)}: list outer "
                                     "swaps first")  # fmt: skip
        return sides

    def swap_permutation(self, m: int) -> list[int]:
        """The permutation of swap ``m`` as a list ``sigma: (n,)`` (an involution:
        ``x[sigma]`` relabels molecules ``x: (..., n, 3)``)."""
        sigma = list(range(self.n_atoms))
        for u, v in zip(*self.swap_sides[m]):
            sigma[u], sigma[v] = v, u
        return sigma

    @property
    def order(self) -> tuple[int, ...]:
        """The atoms in placement order."""
        return (*self.root, *self.cartesian, *(r[0] for r in self.rows))

    @property
    def n_internal(self) -> int:
        """3 n - 6: the coordinates besides the frame's orientation."""
        return 3 + 3 * len(self.cartesian) + 3 * len(self.rows)

    @property
    def rods(self) -> tuple[tuple[int, ...], ...]:
        """The linear groups of `straight`, sorted atoms each: the lines (collinear triples
        joined where they share two atoms, as two points fix a line) through a straight angle
        between two of the Z-matrix's bonds (a nitrile's N-C-C, and atoms in line with it
        such as benzonitrile's para C and H; not a benzene ring's para axes)."""
        groups: list[set[int]] = []
        for t in self.straight:
            joined = [g for g in groups if len(g & set(t)) >= 2]
            groups = [g for g in groups if g not in joined] + [set(t).union(*joined)]
        tree = self._bonds()
        rod = lambda g: any(t[0] in tree[t[1]] and t[2] in tree[t[1]] and set(t) <= g
                            for t in self.straight)  # noqa: E731
        return tuple(sorted(tuple(sorted(g)) for g in groups if rod(g)))

    def _bonds(self) -> dict[int, set[int]]:
        """The bonds the Z-matrix holds (all but ring closures), as neighbour sets."""
        a0, a1, a2 = self.root
        tree: dict[int, set[int]] = {a: set() for a in range(self.n_atoms)}
        for a, b in [(a0, a1), (a2, self.root_bond), *(r[:2] for r in self.rows)]:
            tree[a].add(b)
            tree[b].add(a)
        return tree

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if not self.straight:  # as before linear groups: the same config, the same runs
            del d["straight"]
        if all(len(A) == 1 for A, _ in self.swap_sides):  # as before equivalent sides
            del d["swap_sides"]
        return d

    def describe(self, symbols: list[str] | None = None) -> str:
        """The Z-matrix as lines of text (atoms as ``C3`` with ``symbols``, else ``3``), with a
        note on each row whose bonded references lie on a straight line (`rods`) and on each
        symmetrized row (b of a swap; the sides it swaps where they are more than b)."""
        name = (lambda a: f"{symbols[a]}{a}") if symbols else str
        a0, a1, a2 = self.root
        other = a1 if self.root_bond == a0 else a0
        lines = [f"Z-matrix of {self.n_atoms} atoms (bond, angle, torsion references):",
                 f"  {name(a0)}: origin", f"  {name(a1)}: bond {name(a0)}",
                 f"  {name(a2)}: bond {name(self.root_bond)}, angle {name(other)}"]  # fmt: skip
        if self.rods:
            lines.insert(1, "  on a straight line in the data (no angle or torsion axis along "
                         "it): " + "; ".join(" ".join(map(name, g)) for g in self.rods))
        if self.cartesian:
            lines.append("  ring atoms in the frame of the first three (x, y, z): "
                         + " ".join(name(a) for a in self.cartesian))  # fmt: skip
        line, tree = {frozenset(t) for t in self.straight}, self._bonds()
        half = {b: (a, A, B) for (a, b), (A, B) in zip(self.swaps, self.swap_sides)}
        for i, j, k, l in self.rows:
            notes = []
            if i in half:
                a, A, B = half[i]
                notes.append(" (in (0, 180): geminal pair, symmetrized)" if len(A) == 1 else
                             f" (in (0, 180): equivalent to {name(a)}, symmetrized by swapping "
                             f"the sides {' '.join(map(name, A))} <-> {' '.join(map(name, B))})")
            # a bonded reference skipped because it is on a line: say which, and the choice
            notes += [f" (linear: {name(i)}-{name(j)}-{name(x)} straight, so the angle is to "
                      f"{name(k)})" for x in sorted(tree[j]) if {i, j, x} in line][:1]
            notes += [f" (linear: {name(j)}-{name(k)}-{name(x)} straight, so the torsion is "
                      f"from {name(l)})" for x in sorted(tree[k])
                      if x != j and {j, k, x} in line][:1]  # fmt: skip
            lines.append(f"  {name(i)}: bond {name(j)}, angle {name(k)}, torsion {name(l)}"
                         + "".join(notes))
        return "\n".join(lines)


def _dash(atoms) -> str:
    return "-".join(map(str, atoms))


def _straight(n: int, triples) -> tuple[tuple[int, int, int], ...]:
    """``triples`` as sorted ``(a, b, c)`` with ``a < c``; refuses atoms out of range."""
    out = set()
    for t in triples:
        a, b, c = (int(v) for v in t)
        if len({a, b, c}) != 3 or not all(0 <= v < n for v in (a, b, c)):
            raise ValueError(f"straight triple {tuple(t)} is not three distinct atoms in "
                             f"0..{n - 1}")  # fmt: skip
        out.add((min(a, c), b, max(a, c)))
    return tuple(sorted(out))


def _adjacency(n: int, bonds) -> list[list[int]]:
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, j in bonds:
        i, j = int(i), int(j)
        if not (0 <= i < n and 0 <= j < n) or i == j:
            raise ValueError(f"bond {(i, j)} is not a pair of distinct atoms in 0..{n - 1}")
        if j not in adj[i]:
            adj[i].append(j)
            adj[j].append(i)
    return adj


def _distances(adj: list[list[int]], source: int) -> list[int]:
    """Graph distances from ``source`` (-1: unreachable)."""
    dist = [-1] * len(adj)
    dist[source] = 0
    queue = deque([source])
    while queue:
        a = queue.popleft()
        for b in adj[a]:
            if dist[b] < 0:
                dist[b] = dist[a] + 1
                queue.append(b)
    return dist


def graph_distances(n: int, bonds) -> list[list[int]]:
    """``D[a][b]``: bonds on the shortest path between atoms a and b of the graph ``bonds:
    (B, 2)`` on n atoms (-1: not connected)."""
    adj = _adjacency(n, bonds)
    return [_distances(adj, a) for a in range(n)]


def ring_bonds(n: int, bonds) -> set[tuple[int, int]]:
    """The bonds ``(i, j)``, ``i < j``, that lie on a cycle of the bond graph (not bridges)."""
    adj = _adjacency(n, bonds)
    out: set[tuple[int, int]] = set()
    for i in range(n):
        for j in adj[i]:
            if i < j:  # is (i, j) a bridge? i and j stay connected without it
                seen, stack = {i}, [i]
                while stack:
                    a = stack.pop()
                    for b in adj[a]:
                        if b not in seen and (a, b) != (i, j):
                            seen.add(b)
                            stack.append(b)
                if j in seen:
                    out.add((i, j))
    return out


def ring_atoms(n: int, bonds) -> set[int]:
    """The atoms that lie on a cycle of the bond graph (both ends of every non-bridge bond)."""
    return {a for bond in ring_bonds(n, bonds) for a in bond}


def build_zmatrix(n: int, bonds, atomic_numbers=None, cartesian_rings: bool = False,
                  swaps: bool = True, straight=None, sides: bool = True) -> ZMatrix:  # fmt: skip
    """The Z-matrix of a connected molecule of ``n >= 3`` atoms (rules in the module doc).

    Args:
        n: number of atoms.
        bonds (ArrayLike): ``(B, 2)`` bonded atom pairs.
        atomic_numbers (ArrayLike | None): ``(n,)``; atoms with 1 are hydrogens (placed
            after heavy atoms, and references only where no heavy atom is as near). None:
            all heavy.
        cartesian_rings: place ring atoms as a Cartesian block in the root frame; False
            (the default): ring atoms get Z-matrix rows too (ring-closing bonds implicit).
        swaps: list the pairs of equivalent siblings (`ZMatrix.swaps`); False: none (the
            rows stay the same).
        straight (Iterable[tuple[int, int, int]] | None): ``(a, b, c)`` triples of collinear
            atoms, b in the middle (the angle a-b-c
            near 180 degrees; either order of a and c), e.g.
            `grassflow.manifolds.internal.straight_angles` of conformers: no root, angle or
            torsion axis with its reference is made of three of them. None or (): the bond
            graph alone decides.
        sides: equivalent siblings are those with the same hanging tree (see the module
            doc); False: only terminal hydrogens, the rule before issue 46.

    Raises:
        ValueError: fewer than 3 atoms, a bond out of range, a disconnected graph, or a
            linear molecule (every chain of three bonded atoms in ``straight``).
    """
    if n < 3:
        raise ValueError(f"internal coordinates need at least 3 atoms, got {n}")
    adj = _adjacency(n, bonds)
    Z = [6] * n if atomic_numbers is None else [int(z) for z in atomic_numbers]
    if len(Z) != n:
        raise ValueError(f"atomic_numbers must have {n} entries, got {len(Z)}")
    heavy = [z != 1 for z in Z]
    dist = [_distances(adj, a) for a in range(n)]
    if min(dist[0]) < 0:
        lost = [a for a in range(n) if dist[0][a] < 0]
        raise ValueError(f"the bond graph is not connected: atoms {lost} are not reachable "
                         "from atom 0 (one molecule per cloud)")  # fmt: skip
    straight = _straight(n, straight or ())
    line = {frozenset(t) for t in straight}
    bent = lambda *t: frozenset(t) not in line  # noqa: E731
    rings = ring_atoms(n, bonds) if cartesian_rings else set()
    prefer = lambda a: (not heavy[a], a)  # heavy first, then by index

    # the root: in a ring if there is one, else the most central heavy atom; then the next
    # ones (all atoms last) until three bonded atoms make a bent angle
    pool = sorted(rings) if rings else [a for a in range(n) if heavy[a]] or list(range(n))
    pool = sorted(pool, key=lambda a: (max(dist[a]), -len(adj[a]), a))
    pool += sorted(set(range(n)) - set(pool))
    root = next((r for a0 in pool if (r := _root(a0, adj, rings, prefer, bent))), None)
    if root is None:
        raise ValueError("every chain of three bonded atoms is straight: a linear molecule "
                         "(e.g. HC#CH, CO2) has no frame of internal coordinates; use "
                         "--geometry cartesian" if line else
                         "internal coordinates need a chain of three bonded atoms")
    a0, a1, a2, root_bond = root
    placed = [a0, a1, a2]
    parent: dict[int, int] = {}
    # breadth-first from the root: ring atoms join the Cartesian block as they are reached
    queue = deque(placed)
    seen = set(placed)
    order: list[int] = []
    while queue:
        a = queue.popleft()
        for b in sorted(adj[a], key=prefer):
            if b not in seen:
                seen.add(b)
                parent[b] = a
                queue.append(b)
                order.append(b)
    cartesian = [b for b in order if b in rings]
    rest = [b for b in order if b not in rings]
    placed += cartesian
    rows, used, pairs, sides_of = [], set(), [], []
    group = sibling_groups(rest, parent, adj, Z, sides)
    first_two = {g[1]: g[0] for g in group.values() if len(g) > 1}  # b -> a of each pair
    matched = {b: side_map(a, b, parent[a], adj, Z, rest) for b, a in first_two.items()}
    support = {b: {u for pair in m for u in pair} for b, m in matched.items()}
    position = {a: m for m, a in enumerate(rest)}
    for i in rest:
        j = parent[i]
        members = group.get(i, [i])
        before = members[: members.index(i)]
        refs = lambda: _references(i, j, placed, before, adj, dist, rings, prefer, bent)  # noqa
        pair = None
        if i in first_two:  # b of a pair: l = a, and k in neither side nor in the sides of a
            # later pair (whose swap, applied after this one's, must not move this torsion)
            later = set().union(*(v for b, v in support.items() if position[b] > position[i]))
            avoid = support[i] | later
            pair = next(((k, l) for k, l in refs() if l == first_two[i] and k not in avoid
                         and (j, k, l) not in used), None)  # fmt: skip
        for k, l in [pair] if pair else refs():
            if (j, k, l) not in used:
                break
        else:
            raise ValueError(f"atom {i}: no atoms placed before it give a bent angle {i}-{j}-k "
                             f"and a bent {j}-k-l (a linear molecule?)")  # fmt: skip
        if pair and swaps:
            pairs.append((l, i))
            sides_of.append(tuple(zip(*matched[i])))
        used.add((j, k, l))
        rows.append((i, j, k, l))
        placed.append(i)
    check_automorphisms(sides_of, adj, Z)
    return ZMatrix(n, (a0, a1, a2), root_bond, tuple(cartesian), tuple(rows), tuple(pairs),
                   straight, tuple(sides_of))


def _references(i, j, placed, before, adj, dist, rings, prefer, bent):
    """The ``(k, l)`` choices for atom i bonded to j, best first: k the placed atoms nearest
    to j off the line i-j (heavy first); for each, l the previous hydrogen on j, j's other
    ring neighbour, the nearest to k, a sibling (bonded to j), the others, off the line j-k."""
    for k in sorted((a for a in placed if a != j), key=lambda a: (dist[j][a], *prefer(a))):
        if not bent(i, j, k):
            continue
        candidates = sorted((a for a in placed if a not in (j, k)),
                            key=lambda a: (dist[k][a], *prefer(a)))  # fmt: skip
        # a sibling (placed, bonded to j) in placement order, if the natural one is taken
        siblings = [a for a in placed if a in adj[j] and a != k]
        ring = [a for a in placed if a in rings and a in adj[j] and a != k] if j in rings else []
        for l in [*before[-1:], *ring[:1], candidates[0], *siblings, *candidates[1:]]:
            if l not in (j, k) and bent(j, k, l):
                yield k, l


def _root(a0: int, adj, rings, prefer, bent) -> tuple[int, int, int, int] | None:
    """``(a0, a1, a2, root_bond)`` from ``a0``: a1 its first neighbour, a2 its next one (the
    angle at a0), else a neighbour of a1 (the angle at a1); the first bent choice."""
    near0 = sorted(adj[a0], key=lambda b: (b not in rings, *prefer(b)))
    for a1 in near0:
        for a2 in near0:
            if a2 != a1 and bent(a2, a0, a1):
                return a0, a1, a2, a0
        for a2 in sorted((b for b in adj[a1] if b != a0), key=lambda b: (b not in rings,
                                                                         *prefer(b))):
            if bent(a2, a1, a0):
                return a0, a1, a2, a1
    return None

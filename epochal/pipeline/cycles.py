"""Cycles among views, found once each and named as paths, for the loader's error that lists them."""

from __future__ import annotations

from collections import deque


def view_cycles(views: list[str], upstreams: dict[str, list[str]]) -> list[list[str]]:
    """Each cycle among views once, as a path starting and ending at its first-defined view."""
    order = {name: index for index, name in enumerate(views)}
    edges = {v: [u for u in upstreams[v] if u in order] for v in views}
    cycles: list[list[str]] = []
    for component in _strongly_connected(views, edges):
        if len(component) == 1 and component[0] not in edges[component[0]]:
            continue
        members = set(component)
        start = min(component, key=order.__getitem__)
        cycles.append(_path_back(start, members, edges))
    cycles.sort(key=lambda cycle: order[cycle[0]])
    return cycles


def _path_back(start: str, members: set[str], edges: dict[str, list[str]]) -> list[str]:
    """Shortest path start -> ... -> start inside one strongly connected component (BFS)."""
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for upstream in edges[node]:
            if upstream == start:
                path = [node]
                while (step := parent[path[-1]]) is not None:
                    path.append(step)
                return [*reversed(path), start]
            if upstream in members and upstream not in parent:
                parent[upstream] = node
                queue.append(upstream)
    return [start, start]  # not reached for a component that is a cycle


def _strongly_connected(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm; pipelines are small, recursion depth is fine."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(component)

    for node in nodes:
        if node not in index:
            visit(node)
    return components

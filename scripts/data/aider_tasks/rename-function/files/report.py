from geometry import area_of_circle, area_of_rectangle, area_of_ring


def describe(shapes):
    lines = []
    total = 0.0
    for shape in shapes:
        kind = shape["kind"]
        if kind == "circle":
            area = area_of_circle(shape["radius"])
        elif kind == "rectangle":
            area = area_of_rectangle(shape["width"], shape["height"])
        elif kind == "ring":
            area = area_of_ring(shape["outer"], shape["inner"])
        else:
            raise ValueError(f"unknown shape: {kind}")
        total += area
        lines.append(f"{kind:<10} {area:10.2f}")
    lines.append(f"{'total':<10} {total:10.2f}")
    return "\n".join(lines)


def largest_circle(radii):
    return max(area_of_circle(r) for r in radii)

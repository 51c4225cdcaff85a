import math


def area_of_circle(radius):
    if radius < 0:
        raise ValueError("radius must not be negative")
    return math.pi * radius * radius


def area_of_rectangle(width, height):
    if width < 0 or height < 0:
        raise ValueError("sides must not be negative")
    return width * height


def area_of_ring(outer, inner):
    if inner > outer:
        raise ValueError("the inner radius must not exceed the outer one")
    return area_of_circle(outer) - area_of_circle(inner)


def perimeter_of_rectangle(width, height):
    return 2 * (width + height)


def circumference(radius):
    return 2 * math.pi * radius

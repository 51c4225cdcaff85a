import math


def mean(values):
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle]


def variance(values):
    average = mean(values)
    return sum((v - average) ** 2 for v in values) / len(values)


def stdev(values):
    return math.sqrt(variance(values))


def percentile(values, p):
    ordered = sorted(values)
    position = (len(ordered) - 1) * p / 100
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values):
    return {
        "count": len(values),
        "mean": mean(values),
        "median": median(values),
        "stdev": stdev(values),
        "p90": percentile(values, 90),
    }

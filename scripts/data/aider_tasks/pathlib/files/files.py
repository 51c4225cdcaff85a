import os


def read_lines(path):
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def write_lines(path, lines):
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def find_files(root, suffix):
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(suffix):
                found.append(os.path.join(directory, name))
    return sorted(found)


def size_of(root):
    total = 0
    for path in find_files(root, ""):
        total += os.path.getsize(path)
    return total


def replace_suffix(path, suffix):
    base, _ = os.path.splitext(path)
    return base + suffix

import re
import unicodedata

_WORD = re.compile(r"[A-Za-z0-9']+")


def words(text):
    return _WORD.findall(text)


def slugify(text):
    normalized = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "-".join(word.lower() for word in words(normalized))


def truncate(text, limit, ellipsis="..."):
    if len(text) <= limit:
        return text
    return text[:max(0, limit - len(ellipsis))].rstrip() + ellipsis


def title_case(text, small=("a", "an", "the", "of", "in", "on", "and")):
    parts = text.split()
    return " ".join(part if i and part.lower() in small else part.capitalize() for i, part in enumerate(parts))


def word_counts(text):
    counts = {}
    for word in words(text.lower()):
        counts[word] = counts.get(word, 0) + 1
    return counts


def wrap(text, width):
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return lines

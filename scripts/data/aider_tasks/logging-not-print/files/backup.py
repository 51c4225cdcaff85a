import os
import shutil
import time


def backup(source, destination, extensions=(".txt", ".csv", ".json")):
    print(f"backing up {source} to {destination}")
    started = time.time()
    copied = 0
    skipped = 0
    os.makedirs(destination, exist_ok=True)
    for root, _, names in os.walk(source):
        for name in names:
            path = os.path.join(root, name)
            if not name.endswith(extensions):
                print(f"skipping {path}: not a data file")
                skipped += 1
                continue
            target = os.path.join(destination, os.path.relpath(path, source))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                shutil.copy2(path, target)
            except OSError as error:
                print(f"could not copy {path}: {error}")
                continue
            copied += 1
            if copied % 100 == 0:
                print(f"{copied} files copied so far")
    seconds = time.time() - started
    print(f"done: {copied} copied, {skipped} skipped in {seconds:.1f} s")
    return copied, skipped


def prune(destination, keep_days):
    cutoff = time.time() - keep_days * 86400
    removed = 0
    for root, _, names in os.walk(destination):
        for name in names:
            path = os.path.join(root, name)
            if os.path.getmtime(path) < cutoff:
                os.remove(path)
                removed += 1
    print(f"pruned {removed} files older than {keep_days} days")
    return removed

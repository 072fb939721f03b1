#!/usr/bin/python3
"""Every figure README.md quotes is on the results page it links to (ctest docs_readme_figures).

    /usr/bin/python3 tests/docs/readme_figures.py README.md

README is read in units: a table row, a paragraph, or an indented code block together with the
paragraph after it (a sample output and the sentence that says where it was measured). A figure
is a number followed by a unit: a ratio (1.44×; not a shape such as 3×224×224), %, ms, s, img/s,
samples/s, TFLOP/s, MiB, GB/s; every number of a range or a list before the unit (99.6–100.4%;
88.2, 98.2 and 94.5 s). In a code block, every line that holds "accuracy" is a figure as a
whole.

Each figure must appear literally on a page under bench/results/ that its unit links to: the
number with no digit joined to either side (1.3 is not found in 1.30, nor 100 in 100.4), a code
line with its runs of spaces taken as one. A unit with a figure and no results page fails too.

The check is then turned on itself: for every unit with figures, the first figure is altered
(its last digit changed, or a digit put before it, until the result is on no linked page) and
the unit must then fail; a check that cannot fail fails. Exit 0 when all holds, 1 naming each
figure and page otherwise.
"""
import os
import re
import sys

NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
# numbers (one, a range, or a list: "88.2, 98.2 and 94.5 s") then the unit; a × followed by a
# digit is a shape (3×224×224), not a ratio
FIGURE = re.compile(
    r"(?<![\w.,])(" + NUM + r")(?:(?:\s?[–-]\s?|, | and | or )(?:" + NUM + r"))*"
    r"(?:×(?!\s?\d)|\s?(?:%|ms\b|s\b|img/s|samples/s|(?:model )?TFLOP/s|MiB\b|GB/s))")
NUMBER = re.compile(r"(?<![\w.,])(?:" + NUM + r")")
LINK = re.compile(r"\]\(((?:\./)?bench/results/[^)#\s]+\.md)\)")


def units(text):
    """(first line number, text, code lines) for each table row, paragraph and code block."""
    out, para, code, start = [], [], [], 0

    def close():
        nonlocal para, code
        if para or code:
            out.append((start, "\n".join(code + para), code))
        para, code = [], []

    for i, line in enumerate(text.split("\n"), 1):
        if line.startswith("|"):
            close()
            out.append((i, line, []))
        elif line.startswith("    ") and not para:
            if not code:
                start = i
            code.append(line.strip())
        elif line.strip():
            if not para and not code:
                start = i
            para.append(line)
        elif para:
            close()
    close()
    return out


def figures(text, code):
    found = []
    for m in FIGURE.finditer(text):
        for n in NUMBER.findall(m.group(0)):
            found.append((n, m.group(0)))
    for line in code:
        if "accuracy" in line:
            found.append((" ".join(line.split()), line))
    return found


def on_page(fig, page):
    if " " in fig:  # a code line
        return fig in " ".join(page.split())
    return re.search(r"(?<![\d.,])" + re.escape(fig) + r"(?!\d|[.,]\d)", page) is not None


def read_page(root, link, cache):
    if link not in cache:
        path = os.path.join(root, link)
        cache[link] = open(path, encoding="utf-8").read() if os.path.exists(path) else None
    return cache[link]


def check_unit(line, text, code, root, cache):
    """The problems of one unit, and its figures."""
    figs = figures(text, code)
    if not figs:
        return [], figs
    links = sorted(set(LINK.findall(text)))
    if not links:
        return ["README.md:%d: %s quoted, but no bench/results page linked" %
                (line, ", ".join(f[1] for f in figs))], figs
    problems, texts = [], []
    for link in links:
        page = read_page(root, link, cache)
        if page is None:
            problems.append("README.md:%d: links %s, which does not exist" % (line, link))
        else:
            texts.append(page)
    for fig, shown in figs:
        if not any(on_page(fig, t) for t in texts):
            problems.append("README.md:%d: '%s' (%s) is on none of %s" %
                            (line, fig, shown, ", ".join(links)))
    return problems, figs


def altered(text, code, k):
    """The unit with its first figure changed: for k in 1..9 the number's last digit moved by k
    (mod 10), for k in 11..19 a digit put before it; where the unit's figures are code lines, a
    digit appended to the first one's first decimal."""
    m = FIGURE.search(text)
    if m and k < 10:
        d = str((int(text[m.end(1) - 1]) + k) % 10)
        return text[:m.end(1) - 1] + d + text[m.end(1):], code
    if m:
        return text[:m.start(1)] + str(k - 10) + text[m.start(1):], code
    i = next(i for i, l in enumerate(code) if "accuracy" in l)
    line = re.sub(r"\d\.\d+", lambda n: n.group(0) + str(k % 10), code[i], count=1)
    return text.replace(code[i], line, 1), code[:i] + [line] + code[i + 1:]


def check(readme, root):
    """Problems; and those of each unit's figures whose alteration went unnoticed."""
    problems, cache, n_figs, n_units = [], {}, 0, 0
    for line, text, code in units(readme):
        found, figs = check_unit(line, text, code, root, cache)
        problems += found
        if not figs or found:
            continue
        n_figs, n_units = n_figs + len(figs), n_units + 1
        # an altered figure that the page happens to hold too is no test: try the next digit
        tries = [*range(1, 10), *range(11, 20)]
        if not any(check_unit(line, *altered(text, code, k), root, cache)[0] for k in tries):
            problems.append("README.md:%d: altering its first figure went unnoticed" % line)
    return problems, n_figs, n_units


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: readme_figures.py README.md")
    path = sys.argv[1]
    root = os.path.dirname(os.path.abspath(path))
    readme = open(path, encoding="utf-8").read()
    problems, n_figs, n_units = check(readme, root)
    if problems:
        print("README.md quotes figures its results pages do not hold:\n  " + "\n  ".join(problems))
        return 1
    print("README.md: %d figures in %d places, each on the results page linked there" %
          (n_figs, n_units))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sphinx extension: 选读 (optional deep dive) blocks around cells off the main path.

Listed in ``_config.yml`` under ``sphinx: local_extensions`` (folder ``book/_ext/``). A chapter
marks a deep dive like this (markdown and code cells in between, no heading inside)::

    ```{admonition} 选读：位置编码的线性关系
    :class: optional
    :name: ch01-opt-pe-linear

    一两句话：这里讲什么，为什么可以跳过。
    ```

    … markdown cells and code cells of the deep dive …

    *（选读结束）*

    % optional-end

The start is an ordinary ``admonition`` with the class ``optional`` and the end a MyST comment
line ``% optional-end`` (a line of its own, blank lines around it), because both parsers of the
page understand them: Sphinx (myst-parser) and JupyterLab (jupyterlab-myst, mystmd). In
JupyterLab the start shows as a box titled "选读：…" holding the one-line lead, the comment shows
nothing (hence the visible line *（选读结束）* right before it, which
``tests/test_book_pages.py`` requires; in the HTML it ends the folded content), and every cell
of the block stays in place and runs. (Directives of our own, such as ``{optional-start}``,
show up there as red "Unknown Directive" boxes.)

In the HTML book, this extension moves the admonition and every sibling up to the comment (the
cells of a notebook page are siblings within their section) into one node, written as::

    <details class="optional" id="NAME">
      <summary><span class="optional-title">TITLE</span><div class="optional-lead">LEAD</div></summary>
      <div class="optional-content">… the cells …</div>
    </details>

closed by default (``book/_static/book.css`` styles it; ``book/_static/book-details.js`` opens it
when a link points inside it and when the page is printed; ``scripts/book_pdf.py`` opens every
block before it prints the book). The cells inside are executed and checked by nbval like every
other cell. ``{ref}`NAME``` links to the block with its title as the link text.

Mistakes fail the strict build (``-W``): no ``% optional-end`` after the start in the same section
(a heading in between ends the section), an end without a start, one block inside another, a
title that does not start with 选读, the retired ``{optional-start}``/``{optional-end}`` directives.
"""

from __future__ import annotations

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

CLASS = "optional"
END_COMMENT = "optional-end"
TITLE_PREFIX = "选读"


class optional_block(nodes.General, nodes.Element):
    """A 选读 block: an ``optional_title``, an ``optional_lead``, then the content."""


class optional_title(nodes.TextElement):
    """The block's title (the admonition's title)."""


class optional_lead(nodes.General, nodes.Element):
    """The admonition's body: one or two sentences shown under the title while closed."""


class optional_content(nodes.General, nodes.Element):
    """The cells and paragraphs of the block."""


def _warn(message: str, node: nodes.Node) -> None:
    logger.warning(message, location=node, type="book_optional")


def _is_start(node: nodes.Node) -> bool:
    return isinstance(node, nodes.admonition) and CLASS in node.get("classes", [])


def _is_end(node: nodes.Node) -> bool:
    return isinstance(node, nodes.comment) and node.astext().strip() == END_COMMENT


class GatherOptionalBlocks(SphinxTransform):
    """Replace each start admonition and its following siblings up to the end comment by one block.

    Runs after sphinx-exercise has merged its gated exercises and solutions (priority 10), so a
    whole exercise may sit inside a 选读 block, and before the domains collect labels (850).
    """

    default_priority = 200

    def apply(self, **kwargs) -> None:
        for start in list(self.document.findall(_is_start)):
            parent = start.parent
            index = parent.index(start)
            end_index = None
            for j in range(index + 1, len(parent.children)):
                child = parent.children[j]
                if _is_end(child):
                    end_index = j
                    break
                if _is_start(child) or any(True for _ in child.findall(_is_start)):
                    _warn("a 选读 block inside another 选读 block (blocks do not nest)", child)
                    break
            title = next(iter(start.findall(nodes.title)), None)
            title_text = title.astext() if title is not None else ""
            if not title_text.startswith(TITLE_PREFIX):
                _warn(f"the title of a 选读 block starts with {TITLE_PREFIX}: {title_text!r}", start)
            if end_index is None:
                _warn(
                    f"选读 block {title_text!r} has no '% {END_COMMENT}' line after it in the same "
                    "section (no heading may stand inside a 选读 block)",
                    start,
                )
                start["classes"] = [c for c in start["classes"] if c != CLASS]
                continue
            block = optional_block(title=title_text)
            block.source, block.line = start.source, start.line
            block["ids"] = list(start["ids"])
            block["names"] = list(start["names"])
            block["classes"] = [c for c in start["classes"] if c != "admonition"]
            for node_id in block["ids"]:
                self.document.ids[node_id] = block
            block += optional_title(title_text, "", *(title.children if title is not None else []))
            block += optional_lead("", *[c for c in start.children if c is not title])
            content = parent.children[index + 1 : end_index]
            for child in content:
                parent.remove(child)
            block += optional_content("", *content)
            parent.remove(parent.children[index + 1])  # the end comment
            parent.replace(start, block)
        for end in list(self.document.findall(_is_end)):
            _warn(f"'% {END_COMMENT}' without a 选读 block before it in the same section", end)
            end.parent.remove(end)


class LabelOptionalBlocks(SphinxTransform):
    """``{ref}`NAME``` shows the block's title: the standard domain (priority 850) records the
    name of a plain box only as an anonymous label, which needs an explicit link text."""

    default_priority = 860

    def apply(self, **kwargs) -> None:
        std = self.env.get_domain("std")
        for block in self.document.findall(optional_block):
            for name, node_id in zip(block["names"], block["ids"], strict=False):
                std.labels[name] = (self.env.docname, node_id, block["title"])


class RetiredDirective(SphinxDirective):
    """``{optional-start}``/``{optional-end}``: JupyterLab shows them as "Unknown Directive"."""

    optional_arguments = 1
    final_argument_whitespace = True
    has_content = True
    option_spec = {"label": directives.unchanged, "class": directives.unchanged}

    def run(self):
        node = nodes.comment()
        self.set_source_info(node)
        _warn(
            f"{{{self.name}}} is retired (JupyterLab shows it as an unknown directive): start a "
            "选读 block with ```{admonition} 选读：标题``` + ':class: optional' and end it with the "
            f"line '% {END_COMMENT}' (book/_ext/book_optional.py)",
            node,
        )
        return []


# --------------------------------------------------------------------------- writers


def visit_block_html(self, node: optional_block) -> None:
    classes = " ".join(node.get("classes") or [CLASS])
    node_id = f' id="{node["ids"][0]}"' if node.get("ids") else ""
    self.body.append(f'<details class="{classes}"{node_id}>\n<summary>')


def depart_block_html(self, node: optional_block) -> None:
    self.body.append("</div>\n</details>\n")


def visit_title_html(self, node: optional_title) -> None:
    self.body.append('<span class="optional-title">')


def depart_title_html(self, node: optional_title) -> None:
    self.body.append("</span>")


def visit_lead_html(self, node: optional_lead) -> None:
    self.body.append('<div class="optional-lead">')


def depart_lead_html(self, node: optional_lead) -> None:
    self.body.append('</div></summary>\n<div class="optional-content">\n')


def visit_block_latex(self, node: optional_block) -> None:
    self.body.append("\n\\begin{quote}\n")


def depart_block_latex(self, node: optional_block) -> None:
    self.body.append("\n\\end{quote}\n")


def visit_title_latex(self, node: optional_title) -> None:
    self.body.append("\\textbf{")


def depart_title_latex(self, node: optional_title) -> None:
    self.body.append("}\n\n")


def visit_text_state(self, node) -> None:
    self.new_state(0)


def depart_text_state(self, node) -> None:
    self.end_state()


def visit_pass(self, node) -> None:
    pass


def depart_pass(self, node) -> None:
    pass


def setup(app):
    app.add_node(
        optional_block,
        html=(visit_block_html, depart_block_html),
        latex=(visit_block_latex, depart_block_latex),
        text=(visit_text_state, depart_text_state),
    )
    app.add_node(
        optional_title,
        html=(visit_title_html, depart_title_html),
        latex=(visit_title_latex, depart_title_latex),
        text=(visit_text_state, depart_text_state),
    )
    app.add_node(
        optional_lead,
        html=(visit_lead_html, depart_lead_html),
        latex=(visit_pass, depart_pass),
        text=(visit_pass, depart_pass),
    )
    app.add_node(
        optional_content,
        html=(visit_pass, depart_pass),
        latex=(visit_pass, depart_pass),
        text=(visit_pass, depart_pass),
    )
    app.add_directive("optional-start", RetiredDirective)
    app.add_directive("optional-end", RetiredDirective)
    app.add_transform(GatherOptionalBlocks)
    app.add_transform(LabelOptionalBlocks)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

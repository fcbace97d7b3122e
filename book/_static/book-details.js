// Closed boxes of the book (选读 blocks: <details class="optional">, book/_ext/book_optional.py)
// open by themselves when the reader follows a link to something inside them, and every 选读
// block is open when the page is printed (Ctrl+P; `make pdf` opens them itself).
(() => {
  "use strict";
  const openAround = (el) => {
    for (let d = el && el.closest("details"); d; d = d.parentElement.closest("details")) d.open = true;
  };
  const openTarget = () => {
    if (!location.hash) return;
    let target = null;
    try {
      target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
    } catch (e) {
      return;
    }
    if (target && target.closest("details")) {
      openAround(target);
      target.scrollIntoView();
    }
  };
  window.addEventListener("hashchange", openTarget);
  document.addEventListener("DOMContentLoaded", openTarget);
  let closedForPrint = [];
  window.addEventListener("beforeprint", () => {
    closedForPrint = [...document.querySelectorAll("details.optional:not([open])")];
    closedForPrint.forEach((d) => (d.open = true));
  });
  window.addEventListener("afterprint", () => {
    closedForPrint.forEach((d) => (d.open = false));
    closedForPrint = [];
  });
})();

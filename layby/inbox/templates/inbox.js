// The reviewers' inbox, live: when the server says the requests changed (/inbox/events),
// read the list again and add the new requests in place, leaving alone the ones on screen
// (and whatever is typed in them). Without this script the page works the same, by reload.
(function () {
  "use strict";
  var list = document.getElementById("requests");
  if (!list || !window.EventSource || !window.fetch) { return; }
  var arrivals = document.getElementById("arrivals");

  function refresh() {
    fetch(list.getAttribute("data-refresh"), {credentials: "same-origin"})
      .then(function (reply) { return reply.ok ? reply.text() : null; })
      .then(function (html) { if (html !== null) { merge(html); } })
      .catch(function () { /* the next change tries again */ });
  }

  function merge(html) {
    var fresh = document.createElement("div");
    fresh.innerHTML = html;
    var wanted = fresh.querySelectorAll("article.request");
    var keep = {};
    var added = 0;
    var previous = null;
    for (var i = 0; i < wanted.length; i++) {
      var id = wanted[i].id;
      keep[id] = true;
      var shown = document.getElementById(id);
      if (!shown) {
        shown = wanted[i];
        if (previous) { previous.after(shown); } else { list.prepend(shown); }
        added++;
      }
      previous = shown;
    }
    // Requests answered elsewhere go, unless the reviewer is in the middle of one.
    var current = list.querySelectorAll("article.request");
    for (var j = 0; j < current.length; j++) {
      if (!keep[current[j].id] && !current[j].contains(document.activeElement)) {
        current[j].remove();
      }
    }
    var empty = list.querySelector("p.empty");
    if (empty && list.querySelector("article.request")) { empty.remove(); }
    if (added && arrivals) {
      arrivals.textContent = added === 1 ? "1 new request" : added + " new requests";
    }
  }

  var source = new EventSource(list.getAttribute("data-stream"));
  source.addEventListener("changed", refresh);
})();

// Polar dashboard: live fragments over the rollout server's events, cancel,
// polling of the training page, and the chunked token view. Data is only ever
// inserted as text (textContent); HTML comes from the dashboard's own server,
// which escapes everything it renders.
"use strict";

(() => {
  const LIVE_KINDS = ["task.submitted", "session.status", "session.result", "task.finished"];
  const CHUNK = 2000;

  function refresher(region, url) {
    let timer = null;
    let running = false;
    const refresh = async () => {
      timer = null;
      if (running) { schedule(); return; }
      running = true;
      try {
        const reply = await fetch(url, { credentials: "same-origin" });
        if (reply.status === 401) { location.assign("/login"); return; }
        if (reply.ok) {
          region.innerHTML = await reply.text();
          region.dataset.refreshed = String(Number(region.dataset.refreshed || 0) + 1);
        }
      } finally {
        running = false;
      }
    };
    const schedule = () => { if (timer === null) timer = setTimeout(refresh, 150); };
    return schedule;
  }

  function followEvents(region) {
    const state = document.getElementById("live-state");
    const schedule = refresher(region, region.dataset.live);
    const source = new EventSource("/api/events");
    source.addEventListener("open", () => { if (state) state.textContent = "live"; schedule(); });
    source.addEventListener("error", () => { if (state) state.textContent = "reconnecting…"; });
    source.addEventListener("dashboard.error", (event) => {
      if (state) state.textContent = JSON.parse(event.data).message;
    });
    for (const kind of LIVE_KINDS) source.addEventListener(kind, schedule);
    window.addEventListener("pagehide", () => source.close());
    return schedule;
  }

  function poll(region) {
    const schedule = refresher(region, region.dataset.poll);
    setInterval(schedule, 5000);
  }

  function cancelButtons(afterwards) {
    document.addEventListener("click", async (event) => {
      const button = event.target.closest("button[data-cancel]");
      if (!button) return;
      button.disabled = true;
      const note = button.nextElementSibling;
      const path = "/api/tasks/" + encodeURIComponent(button.dataset.cancel) + "/cancel";
      const reply = await fetch(path, { method: "POST", headers: { "x-polar-dashboard": "1" } });
      if (note) note.textContent = reply.ok ? "cancelling…" : "cancel failed (" + reply.status + ")";
      if (afterwards) afterwards();
    });
  }

  function heat(logprob) {
    // probability 1 -> green (hue 130), 0 -> red (hue 0)
    const p = Math.exp(Math.max(logprob, -20));
    return "hsl(" + Math.round(130 * p) + ", 75%, 42%)";
  }

  async function tokenView(box) {
    const summary = document.getElementById("token-summary");
    const tip = document.getElementById("tip");
    const reply = await fetch(box.dataset.src, { credentials: "same-origin" });
    if (!reply.ok) {
      box.dataset.state = "error";
      summary.textContent = "could not load the tokens (" + reply.status + ")";
      return;
    }
    const data = await reply.json();
    const markers = new Map();
    for (const marker of data.markers) {
      if (!markers.has(marker.at)) markers.set(marker.at, []);
      markers.get(marker.at).push(marker);
    }
    let rendered = 0;
    const chunks = [];
    const lineChars = Math.max(40, Math.floor(box.clientWidth / 7.6));
    for (let start = 0; start < data.total; start += CHUNK) {
      const end = Math.min(start + CHUNK, data.total);
      let chars = 0;
      for (let i = start; i < end; i++) chars += data.text[i].length;
      const div = document.createElement("div");
      div.className = "chunk";
      div.dataset.start = String(start);
      div.dataset.end = String(end);
      div.style.minHeight = Math.ceil(chars / lineChars + 2) * 24 + "px";
      box.appendChild(div);
      chunks.push(div);
    }
    const render = (div) => {
      if (div.dataset.rendered) return;
      const start = Number(div.dataset.start);
      const end = Number(div.dataset.end);
      const out = document.createDocumentFragment();
      for (let i = start; i < end; i++) {
        for (const marker of markers.get(i) || []) {
          const mark = document.createElement("span");
          mark.className = "mk mk-" + marker.kind;
          mark.textContent = marker.label;
          out.appendChild(mark);
        }
        const span = document.createElement("span");
        const logprob = data.logprob[i];
        span.className = data.mask[i] ? "t m1" : "t m0";
        if (logprob === null) {
          if (data.mask[i]) span.className += " nolp";
        } else {
          span.style.borderBottomColor = heat(logprob);
        }
        span.dataset.i = String(i);
        span.textContent = data.text[i] === "" ? "\u00b7" : data.text[i];
        out.appendChild(span);
      }
      div.replaceChildren(out);
      div.style.minHeight = "";
      div.dataset.rendered = "1";
      rendered += end - start;
      box.dataset.rendered = String(rendered);
      if (rendered === data.total) box.dataset.complete = String(performance.now());
    };
    const observer = new IntersectionObserver((entries) => {
      for (const entry of entries) {
        if (entry.isIntersecting) {
          render(entry.target);
          observer.unobserve(entry.target);
        }
      }
    }, { rootMargin: "1500px 0px" });
    for (const div of chunks) observer.observe(div);
    if (chunks.length) render(chunks[0]);
    summary.textContent = data.total + " tokens: " + data.prompt_tokens + " of the first prompt, "
      + data.trained_tokens + " trained (loss mask 1); " + data.markers.length + " markers";
    // The view opens on the first trained token, past a prompt that may be
    // thousands of pixels tall; a link in the summary goes back to it.
    const first = data.mask.indexOf(1);
    if (first >= 0) {
      const jump = () => {
        const at = Math.floor(first / CHUNK);
        for (const div of chunks.slice(Math.max(0, at - 1), at + 1)) render(div);
        const span = box.querySelector('.t[data-i="' + first + '"]');
        span.classList.add("first-trained");
        span.scrollIntoView({ block: "center" });
        return span;
      };
      const link = document.createElement("a");
      link.href = "#first-trained";
      link.id = "first-trained-link";
      link.textContent = "first trained token (#" + first + ")";
      link.addEventListener("click", (event) => { event.preventDefault(); jump(); });
      summary.append(" · ", link);
      if (!location.hash) box.dataset.landedAt = String(jump().dataset.i);
    }
    box.dataset.total = String(data.total);
    box.dataset.readyAt = String(Math.round(performance.now()));
    box.dataset.state = "ready";
    box.addEventListener("mouseover", (event) => {
      const span = event.target.closest(".t");
      if (!span) { tip.hidden = true; return; }
      const i = Number(span.dataset.i);
      const logprob = data.logprob[i];
      tip.textContent = "#" + i + "  id " + data.ids[i]
        + "  " + (data.mask[i] ? "trained" : "not trained")
        + (logprob === null ? "" : "  logprob " + logprob.toFixed(4)
          + "  p " + Math.exp(logprob).toFixed(4));
      const rect = span.getBoundingClientRect();
      tip.style.left = Math.round(rect.left) + "px";
      tip.style.top = Math.round(rect.bottom + 4) + "px";
      tip.hidden = false;
    });
    box.addEventListener("mouseleave", () => { tip.hidden = true; });
  }

  function start() {
    const live = document.querySelector("[data-live]");
    const schedule = live ? followEvents(live) : null;
    const polled = document.querySelector("[data-poll]");
    if (polled) poll(polled);
    cancelButtons(schedule);
    const tokens = document.getElementById("tokens");
    if (tokens) tokenView(tokens);
  }

  start();
})();

// corral's status page: the cluster strip, the GPU grid, the queue (paged by the
// coordinator), the last 24 hours, and a page per job, kept current by the coordinator's
// event stream (GET /v1/status/events). No framework, nothing fetched from elsewhere.
'use strict';

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = 'corral.token';
const LOG_TAIL_BYTES = 16384;
const FEED_SILENCE_MS = 40000;  // the coordinator sends a ping every 15 s

const page = {
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  user: null,
  offset: 0,
  limit: 100,
  seq: null,
  ended: null,
  skewMs: 0,             // server clock minus ours
  status: null,
  history: null,
  historyError: null,
  job: null,             // the job page's job
  jobError: null,
  logs: {},              // rank -> {text, error}
  logsAt: 0,
  feed: null,            // AbortController of the live feed
  refreshing: false,
  again: false,
};

// ---------------------------------------------------------------- helpers

function esc(value) {
  return String(value ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}

function authHeaders() {
  return page.token ? { Authorization: 'Bearer ' + page.token } : {};
}

async function api(path, signal) {
  const response = await fetch(path, { headers: authHeaders(), cache: 'no-store', signal });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const error = new Error((body && body.error) || response.status + ' ' + response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const serverNow = () => Date.now() + page.skewMs;

function duration(seconds) {
  if (seconds == null || !isFinite(seconds)) return '';
  seconds = Math.max(0, Math.floor(seconds));
  const d = Math.floor(seconds / 86400), h = Math.floor(seconds % 86400 / 3600);
  const m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
  const two = (n) => String(n).padStart(2, '0');
  if (d > 0) return d + 'd ' + two(h) + 'h';
  if (h > 0) return h + 'h ' + two(m) + 'm';
  if (m > 0) return m + 'm ' + two(s) + 's';
  return s + 's';
}

function since(iso) {
  return iso ? (serverNow() - Date.parse(iso)) / 1000 : null;
}

function between(from, to) {
  return from && to ? (Date.parse(to) - Date.parse(from)) / 1000 : null;
}

function clock(iso) {
  if (!iso) return '';
  const t = new Date(iso);
  const sameDay = new Date(serverNow()).toDateString() === t.toDateString();
  return sameDay ? t.toLocaleTimeString() : t.toLocaleString();
}

// A colour per job, the same on every refresh: hue from the id.
function jobColour(id) {
  const hue = Math.round((Number(id) * 137.508) % 360);
  return 'hsl(' + hue + ', 55%, 42%)';
}

function jobLink(id, text) {
  return '<a href="#/job/' + encodeURIComponent(id) + '">' + esc(text ?? id) + '</a>';
}

function stateCell(state) {
  return '<span class="state-' + esc(state) + '">' + esc(state) + '</span>';
}

function setNotice(text) {
  $('notice').textContent = text || '';
}

// ---------------------------------------------------------------- the cluster

function renderStrip(s) {
  const cards = [];
  for (const c of s.classes) {
    const gib = c.memory_mib ? ' · ' + Math.round(c.memory_mib / 1024) + ' GiB' : '';
    cards.push('<div class="card" data-class="' + esc(c.product) + '"><div class="title">' + esc(c.product) + gib + '</div>' +
      '<div class="big">' + esc(c.allocated) + ' / ' + esc(c.total) + ' GPUs allocated</div>' +
      '<div class="parts">' + esc(c.free) + ' free · ' + esc(c.drained) + ' drained · ' + esc(c.down) + ' down</div></div>');
  }
  if (s.classes.length === 0) cards.push('<div class="card"><div class="title">GPUs</div><div class="big">none</div></div>');
  const n = s.nodes_by_state;
  cards.push('<div class="card" id="strip-nodes"><div class="title">nodes</div><div class="big">' + esc(n.up) + ' up</div>' +
    '<div class="parts">' + esc(n.drained) + ' drained · ' + esc(n.down) + ' down</div></div>');
  const j = s.jobs_by_state;
  const running = (j.RUNNING || 0) + (j.STARTING || 0) + (j.ENDING || 0);
  cards.push('<div class="card" id="strip-jobs"><div class="title">jobs</div><div class="big">' + esc(running) + ' running</div>' +
    '<div class="parts">' + esc(j.PENDING || 0) + ' pending' + (j.ENDING ? ' · ' + esc(j.ENDING) + ' ending' : '') + '</div></div>');
  $('strip').innerHTML = cards.join('');
}

function renderGrid(s) {
  const rows = [];
  for (const node of s.nodes) {
    let badges = '';
    if (node.simulated) badges += '<span class="badge">simulated</span>';
    if (node.state === 'down') badges += '<span class="badge down">down</span>';
    if (node.state === 'drained') badges += '<span class="badge drained">drained</span>';
    if (!node.connected && node.state !== 'down') badges += '<span class="badge down" title="its agent is not connected: it takes no new job">agent away</span>';
    const why = node.reason ? '<div class="why">' + esc(node.reason) + '</div>' : '';
    const cells = node.gpus.map((g) => {
      if (g.job == null && g.held) {
        // Held by a job this page may not name (the coordinator's private_data: jobs).
        return '<div class="gpu held private" data-gpu="' + esc(g.index) + '" title="' + esc(node.name + ' GPU ' + g.index + ': held by another user\'s job') + '">' + esc(g.index) + '</div>';
      }
      if (g.job == null) {
        const what = node.state === 'up' ? 'free' : node.state;
        return '<div class="gpu" data-gpu="' + esc(g.index) + '" title="' + esc(node.name + ' GPU ' + g.index + ': ' + what) + '">' + esc(g.index) + '</div>';
      }
      const j = s.holders[g.job] || {};
      const title = node.name + ' GPU ' + g.index + ': job ' + (j.ref || g.job) + ' ' + (j.name || '') + '\n' +
        'user ' + (j.user || '?') + ' · ' + (j.state || '') + (j.started_at ? ' · ' + duration(since(j.started_at)) : '');
      return '<a class="gpu held" href="#/job/' + encodeURIComponent(j.ref || g.job) + '" data-gpu="' + esc(g.index) + '" data-job="' + esc(g.job) +
        '" style="background:' + jobColour(g.job) + '" title="' + esc(title) + '">' + esc(g.index) + '</a>';
    }).join('');
    rows.push('<div class="node ' + esc(node.state) + '" data-node="' + esc(node.name) + '">' +
      '<div class="name" title="' + esc(node.class || '') + '">' + esc(node.name) + badges + why + '</div>' +
      '<div class="cells">' + cells + '</div></div>');
  }
  $('grid').innerHTML = rows.length ? rows.join('') : '<p class="muted">No node has joined yet.</p>';
}

function renderQueue(s) {
  const q = s.queue;
  const body = q.rows.map((r) => {
    const time = r.state === 'PENDING' ? 'waiting ' + duration(since(r.submitted_at)) : duration(since(r.started_at));
    const reason = r.reason ? esc(r.reason) + (r.detail ? ' <span class="muted">' + esc(r.detail) + '</span>' : '') : '';
    const ref = r.elements > 1 ? esc(r.ref) : jobLink(r.ref);
    return '<tr data-id="' + esc(r.id) + '" data-state="' + esc(r.state) + '"><td>' + ref + '</td><td>' + esc(r.name) + '</td><td>' + esc(r.user) +
      '</td><td>' + stateCell(r.state) + '</td><td class="num">' + esc(r.gpus) + '</td><td>' + esc(r.nodes) + '</td><td>' + time +
      '</td><td>' + reason + '</td></tr>';
  }).join('');
  let empty = 'The queue is empty.';
  if (s.private_jobs && !page.token) empty = 'This cluster shows each user their own jobs only: log in to see yours.';
  else if (s.private_jobs) empty = 'You have no job in the queue.';
  $('queue').tBodies[0].innerHTML = body || '<tr><td colspan="8" class="muted">' + esc(empty) + '</td></tr>';
  const first = q.total === 0 ? 0 : q.offset + 1, last = q.offset + q.rows.length;
  $('queue-pager').innerHTML =
    '<button id="queue-prev"' + (q.offset === 0 ? ' disabled' : '') + '>« previous</button>' +
    '<span id="queue-range">' + (q.total === 0 ? 'no jobs' : 'rows ' + first + '–' + last + ' of ' + q.total.toLocaleString()) + '</span>' +
    '<button id="queue-next"' + (last >= q.total ? ' disabled' : '') + '>next »</button>';
  $('queue-prev').onclick = () => { page.offset = Math.max(0, page.offset - page.limit); refresh(); };
  $('queue-next').onclick = () => { page.offset += page.limit; refresh(); };
}

function renderHistory() {
  if (!page.token) {
    $('history').innerHTML = '<p class="muted">Log in to see the jobs that ended.</p>';
    return;
  }
  if (page.historyError) {
    $('history').innerHTML = '<p class="muted">' + esc(page.historyError) + '</p>';
    return;
  }
  if (!page.history) return;
  if (page.history.length === 0) {
    $('history').innerHTML = '<p class="muted">No job ended in the last 24 hours.</p>';
    return;
  }
  const rows = page.history.map((j) => {
    const ref = j.array ? j.array.job + '_' + j.array.index : String(j.id);
    return '<tr data-id="' + esc(j.id) + '"><td>' + jobLink(ref) + '</td><td>' + esc(j.name) + '</td><td>' + esc(j.user) + '</td><td>' +
      stateCell(j.state) + '</td><td class="num">' + esc(j.exit_code ?? '') + '</td><td class="num">' + esc(j.failed_rank ?? '') +
      '</td><td>' + esc(j.failed_node || '') + '</td><td>' + duration(between(j.started_at, j.ended_at)) + '</td><td>' + clock(j.ended_at) + '</td></tr>';
  }).join('');
  $('history').innerHTML = '<table id="history-table"><thead><tr><th>ID</th><th>Name</th><th>User</th><th>Outcome</th><th>Exit</th>' +
    '<th>Failing rank</th><th>Node</th><th>Ran</th><th>Ended</th></tr></thead><tbody>' + rows + '</tbody></table>';
}

// ---------------------------------------------------------------- a job

function jobRefFromHash() {
  const m = /^#\/job\/([0-9]+(?:_[0-9]+)?)$/.exec(location.hash);
  return m ? m[1] : null;
}

function renderJob() {
  const out = $('job');
  if (!page.token) {
    out.innerHTML = '<p>Log in to see job ' + esc(jobRefFromHash()) + ': its details and logs need a token.</p>';
    return;
  }
  if (page.jobError) {
    out.innerHTML = '<p id="job-error">' + esc(page.jobError) + '</p>';
    return;
  }
  const j = page.job;
  if (!j) {
    out.innerHTML = '<p class="muted">Loading…</p>';
    return;
  }
  const ref = j.array ? j.array.job + '_' + j.array.index : String(j.id);
  const ran = j.started_at ? duration(j.ended_at ? between(j.started_at, j.ended_at) : since(j.started_at)) : '';
  const field = (name, value) => (value === '' || value == null ? '' : '<dt>' + esc(name) + '</dt><dd>' + value + '</dd>');
  let html = '<h2 id="job-title">Job ' + esc(ref) + ' · ' + esc(j.name) + ' · ' + stateCell(j.state) + '</h2><dl class="fields">' +
    field('user', esc(j.user)) +
    field('state', stateCell(j.state) + (j.reason ? ' · ' + esc(j.reason) : '') + (j.detail ? ' <span class="muted">' + esc(j.detail) + '</span>' : '')) +
    field('attempt', esc(j.attempt)) +
    field('shape', esc(j.nodes + ' node' + (j.nodes === 1 ? '' : 's') + ', ' + j.gpus + ' GPU' + (j.gpus === 1 ? '' : 's'))) +
    field('nodes', esc((j.node_list || []).join(', '))) +
    field('master', j.master_addr ? esc(j.master_addr + ':' + j.master_port) : '') +
    field('submitted', esc(clock(j.submitted_at))) +
    field('started', esc(clock(j.started_at))) +
    field('ended', esc(clock(j.ended_at))) +
    field(j.ended_at ? 'ran' : 'running for', esc(ran)) +
    field('exit code', j.exit_code == null ? '' : esc(j.exit_code)) +
    field('failing rank', j.failed_rank == null ? '' : esc(j.failed_rank + (j.failed_node ? ' on ' + j.failed_node : ''))) +
    '</dl>';
  html += '<h2>Ranks</h2>';
  if (j.ranks.length === 0) {
    html += '<p class="muted">No rank has started.</p>';
  } else {
    html += '<table id="ranks"><thead><tr><th>Rank</th><th>Node</th><th>Local</th><th>GPUs</th><th>PID</th><th>State</th><th>Exit</th></tr></thead><tbody>' +
      j.ranks.map((r) => '<tr data-rank="' + esc(r.rank) + '"><td class="num">' + esc(r.rank) + '</td><td>' + esc(r.node) + '</td><td class="num">' + esc(r.local_rank) +
        '</td><td>' + esc(r.gpus.join(',')) + '</td><td class="num">' + esc(r.pid ?? '') + '</td><td>' + esc(r.state) + '</td><td class="num">' +
        esc(r.exit_code ?? (r.signal != null ? 'signal ' + r.signal : '')) + '</td></tr>').join('') + '</tbody></table>';
  }
  html += '<h2>Logs</h2>';
  if (j.ranks.length === 0) html += '<p class="muted">No log yet.</p>';
  for (const r of j.ranks) {
    const log = page.logs[r.rank];
    let text = '<span class="muted">loading…</span>';
    if (log && log.error) text = '<span class="muted">' + esc(log.error) + '</span>';
    else if (log) text = '<pre class="log" data-rank="' + esc(r.rank) + '">' + (log.cut ? '… ' : '') + esc(log.text) + '</pre>';
    html += '<details open><summary>rank ' + esc(r.rank) + ' on ' + esc(r.node) + '</summary>' + text + '</details>';
  }
  html += '<h2>Events</h2><ul id="events">' + (j.events || []).map((e) => '<li>' + esc(clock(e.at)) + ' · ' + esc(e.text) + '</li>').join('') + '</ul>';
  if (j.spec != null) html += '<h2>Spec</h2><pre id="spec">' + esc(j.spec) + '</pre>';
  out.innerHTML = html;
}

async function loadLogs(job) {
  const logs = {};
  await Promise.all(job.ranks.map(async (r) => {
    const base = '/v1/jobs/' + job.id + '/logs?rank=' + r.rank;
    try {
      const head = await api(base + '&offset=0&max=0');
      const from = Math.max(0, head.size - LOG_TAIL_BYTES);
      const tail = await api(base + '&offset=' + from + '&max=' + LOG_TAIL_BYTES);
      logs[r.rank] = { text: tail.data, cut: from > 0 };
    } catch (e) {
      logs[r.rank] = { error: e.message };
    }
  }));
  page.logs = logs;
  page.logsAt = Date.now();
}

async function loadJob() {
  const ref = jobRefFromHash();
  if (!ref || !page.token) return;
  try {
    const job = await api('/v1/jobs/' + encodeURIComponent(ref));
    const live = !job.ended_at;
    const first = !page.job || page.job.id !== job.id;
    page.job = job;
    page.jobError = null;
    // A live job's logs grow: read them again at most every 2 s.
    if (first || (live && Date.now() - page.logsAt > 2000) || (!live && page.logsAt < Date.parse(job.ended_at))) await loadLogs(job);
  } catch (e) {
    page.job = null;
    page.jobError = e.status === 404 ? 'There is no job ' + ref + '.' : 'Job ' + ref + ': ' + e.message;
  }
}

// ---------------------------------------------------------------- loading

async function loadStatus() {
  try {
    const s = await api('/v1/status?offset=' + page.offset + '&limit=' + page.limit);
    page.skewMs = Date.parse(s.time) - Date.now();
    page.status = s;
    if (s.queue.total > 0 && s.queue.offset >= s.queue.total) {
      page.offset = Math.max(0, Math.floor((s.queue.total - 1) / page.limit) * page.limit);
      page.again = true;
    }
    setNotice('');
    $('data-time').textContent = 'data at ' + new Date(Date.parse(s.time)).toLocaleTimeString();
    $('data-time').dataset.time = s.time;
  } catch (e) {
    if (e.status === 401) setNotice(page.token ? 'The coordinator refused the token: ' + e.message : 'This cluster shows its status to its users only: log in with your API token.');
    else setNotice('Could not load the status: ' + e.message);
  }
}

async function loadHistory() {
  if (!page.token) return;
  try {
    const jobs = await api('/v1/history?since=24h&limit=500');
    jobs.sort((a, b) => Date.parse(b.ended_at) - Date.parse(a.ended_at));
    page.history = jobs;
    page.historyError = null;
  } catch (e) {
    page.historyError = 'Could not load the history: ' + e.message;
  }
}

function render() {
  const ref = jobRefFromHash();
  $('cluster-view').hidden = ref != null;
  $('job-view').hidden = ref == null;
  if (ref != null) {
    renderJob();
    document.title = 'corral · job ' + ref;
    return;
  }
  document.title = 'corral';
  if (page.status) {
    $('store-error').textContent = page.status.store_error
      ? 'The coordinator cannot write its database (' + page.status.store_error +
        '): what is shown may not be kept, submissions and cancels are refused, and it recovers by itself once it can write.'
      : '';
    renderStrip(page.status);
    renderGrid(page.status);
    renderQueue(page.status);
  }
  renderHistory();
}

// One refresh at a time; a change that arrives meanwhile runs one more after it.
async function refresh(withHistory) {
  if (withHistory) page.wantHistory = true;
  if (page.refreshing) {
    page.again = true;
    return;
  }
  page.refreshing = true;
  try {
    do {
      page.again = false;
      const history = page.wantHistory;
      page.wantHistory = false;
      if (jobRefFromHash()) {
        await loadJob();
      } else {
        await Promise.all([loadStatus(), history || !page.history ? loadHistory() : null]);
      }
      render();
    } while (page.again);
  } finally {
    page.refreshing = false;
  }
}

// ---------------------------------------------------------------- the live feed

function setLive(on, why) {
  const el = $('live');
  el.className = on ? 'on' : 'off';
  el.textContent = on ? 'live' : 'disconnected';
  el.title = on ? 'updates arrive as they happen' : (why || 'the live feed is down; trying again');
}

function onEvent(block) {
  let type = 'message', data = '';
  for (const line of block.split('\n')) {
    if (line.startsWith('event:')) type = line.slice(6).trim();
    else if (line.startsWith('data:')) data += line.slice(5).trim();
  }
  if (type !== 'change' || !data) return;
  const change = JSON.parse(data);
  const ended = page.ended !== null && change.ended !== page.ended;
  if (change.seq !== page.seq || ended) {
    page.seq = change.seq;
    page.ended = change.ended;
    refresh(ended);
  }
}

async function feed() {
  let backoff = 1000;
  for (;;) {
    const control = new AbortController();
    page.feed = control;
    let silence = null;
    const watch = () => {
      clearTimeout(silence);
      silence = setTimeout(() => control.abort(), FEED_SILENCE_MS);
    };
    try {
      watch();
      const response = await fetch('/v1/status/events', { headers: authHeaders(), cache: 'no-store', signal: control.signal });
      if (!response.ok) {
        const error = new Error(response.status === 401 ? 'log in to follow the cluster' : 'the coordinator answered ' + response.status);
        error.status = response.status;
        throw error;
      }
      setLive(true);
      backoff = 1000;
      page.seq = null;  // whatever the first event says, load once more: we may have missed changes
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        watch();
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          onEvent(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
      setLive(false, 'the coordinator closed the live feed');
    } catch (e) {
      setLive(false, e.message);
      if (e.status === 401) {
        clearTimeout(silence);
        await new Promise((resolve) => { page.wakeFeed = resolve; });  // until someone logs in
        continue;
      }
    } finally {
      clearTimeout(silence);
    }
    await sleep(backoff);
    backoff = Math.min(backoff * 2, 10000);
  }
}

function restartFeed() {
  if (page.feed) page.feed.abort();
  if (page.wakeFeed) {
    const wake = page.wakeFeed;
    page.wakeFeed = null;
    wake();
  }
}

// ---------------------------------------------------------------- logging in

async function showUser() {
  $('token').hidden = !!page.token;
  $('login-button').hidden = !!page.token;
  $('logout-button').hidden = !page.token;
  $('who').textContent = '';
  if (!page.token) return;
  try {
    const me = await api('/v1/whoami');
    page.user = me.user;
    $('who').textContent = me.user + (me.admin ? ' (admin)' : '');
  } catch (e) {
    if (e.status === 401) logout('the coordinator does not know that token');
  }
}

function logout(why) {
  page.token = '';
  page.user = null;
  page.history = null;
  page.job = null;
  sessionStorage.removeItem(TOKEN_KEY);
  $('login-error').textContent = why || '';
  showUser();
  restartFeed();
  refresh(true);
}

$('login').addEventListener('submit', async (event) => {
  event.preventDefault();
  const token = $('token').value.trim();
  if (!token) return;
  $('login-error').textContent = '';
  const response = await fetch('/v1/whoami', { headers: { Authorization: 'Bearer ' + token }, cache: 'no-store' });
  if (!response.ok) {
    $('login-error').textContent = response.status === 401 ? 'unknown token' : 'the coordinator answered ' + response.status;
    return;
  }
  page.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('token').value = '';
  await showUser();
  restartFeed();
  refresh(true);
});

$('logout-button').addEventListener('click', () => logout());

window.addEventListener('hashchange', () => {
  page.job = null;
  page.jobError = null;
  page.logs = {};
  page.logsAt = 0;
  render();
  refresh(true);
});

// Elapsed and waiting times move on between changes.
setInterval(() => {
  if (!page.refreshing && !jobRefFromHash()) render();
}, 5000);

showUser();
refresh(true);
feed();

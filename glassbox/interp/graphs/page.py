"""An offline page for an attribution graph: one HTML file, no script or style from the network.

Nodes are placed by layer (rows: embeddings at the bottom, then layer 0, 1, ..., the logits at the top)
and position (columns, each as wide as its most crowded row needs); edges are drawn with width by |weight| (blue positive, red negative). Clicking a
node shows what it is, its activation and influence, and its strongest inputs and outputs; "pin" adds it
to a subgraph and "show pinned" draws only the pinned nodes and the edges among them. Shift-click adds a node
to a selection (outlined); "group" makes the selected nodes one supernode, labelled with the text in the label
box, drawn as one box (``rect.super``) at their mean place whose edges are the sums of its members' edges
(edges between two members are left out; each drawn ``line`` carries ``data-source``, ``data-target`` and
``data-weight``); clicking a supernode selects it and "ungroup" dissolves it. With ``details`` (from
``details.feature_details``), clicking a feature shows its top-activating contexts (tokens shaded by the
feature's activation) and its logit effects. The graph is laid out to the width of its pane, so no node
falls outside the window (redrawn on resize). The data is the
pruned graph (``frontend_json``'s), embedded as JSON in a ``<script type="application/json">`` element
(with ``</`` escaped, so token text cannot end the script).
"""

import html
import json
from typing import Optional

TEMPLATE = """<!doctype html><html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>body{font:13px sans-serif;margin:0;display:flex}#pane{flex:1;min-width:0;overflow-y:auto;height:100vh}#g{display:block}
#side{width:300px;flex:none;padding:8px;border-left:1px solid #ccc;overflow:auto;height:100vh;box-sizing:border-box}
circle,rect.super{cursor:pointer;stroke:#333}circle.pinned{stroke:#e80;stroke-width:3}circle.chosen,rect.chosen{stroke:#0a0;stroke-width:3}
rect.super{fill:#fd8}.lbl{font-size:10px;fill:#555}.ctx{font-family:monospace;white-space:pre-wrap;margin:2px 0}
.ctx .v{color:#555;display:inline-block;min-width:4em}.tok.top{outline:1px solid #000}</style></head><body>
<div id="pane"><svg id="g"></svg></div><div id="side"><h3>__TITLE__</h3>
<p id="prompt"></p><button id="pin">pin</button> <button id="only">show pinned</button> <button id="all">show all</button><br>
<input id="label" placeholder="supernode label" size="16"> <button id="group">group</button> <button id="ungroup">ungroup</button>
<p class="lbl">shift-click: select nodes to group</p><div id="info">Click a node.</div><div id="details"></div></div>
<script type="application/json" id="data">__DATA__</script>
<script>
const D=JSON.parse(document.getElementById('data').textContent);const svg=document.getElementById('g');const DET=D.feature_details||{};
const NS='http://www.w3.org/2000/svg';const NT=D.metadata.prompt_tokens.length,LAYERS=D.n_layers+2,RH=70;let W=600;
document.getElementById('prompt').textContent=D.metadata.prompt;
function row(n){return n.layer==='E'?0:n.feature_type==='logit'?LAYERS-1:(+n.layer)+1}
const byId={};const slots={};D.nodes.forEach(n=>{byId[n.node_id]=n;const k=row(n)+':'+n.ctx_idx;slots[k]=(slots[k]||0)+1;n.slot=slots[k]-1});
const colw=D.metadata.prompt_tokens.map((_,i)=>1+Math.max(0,...Object.keys(slots).filter(k=>+k.split(':')[1]===i).map(k=>slots[k])));
const col0=colw.map((_,i)=>colw.slice(0,i).reduce((a,b)=>a+b,0)),CT=col0[NT-1]+colw[NT-1],M=10;
function cx(i,f){return M+(W-2*M)*(col0[i]+f*colw[i])/CT}
function place(){W=Math.max(120,document.getElementById('pane').clientWidth);svg.setAttribute('width',W);svg.setAttribute('height',(LAYERS-1)*RH+70);
D.nodes.forEach(n=>{const m=slots[row(n)+':'+n.ctx_idx];n.x=cx(n.ctx_idx,(n.slot+1)/(m+1));n.y=(LAYERS-1-row(n))*RH+30})}
let pinned=new Set(),selected=null,onlyPinned=false,chosen=new Set(),groups=[],nGroups=0;
const wmax=Math.max(...D.links.map(l=>Math.abs(l.weight)),1e-12);
function name(n){if(n.members)return 'supernode '+JSON.stringify(n.label)+' ('+n.members.length+' nodes)';
if(n.feature_type==='embedding')return 'token '+JSON.stringify(D.metadata.prompt_tokens[n.ctx_idx])+' @'+n.ctx_idx;
if(n.feature_type==='logit')return n.clerp;if(n.feature_type==='mlp reconstruction error')return 'error L'+n.layer+' @'+n.ctx_idx;
return 'feature '+n.node_id.split('_')[1]+' L'+n.layer+' @'+n.ctx_idx}
function groupOf(id){return groups.find(g=>g.members.includes(id))}
function rep(id){const g=groupOf(id);return g?g.node_id:id}
function shown(id){const g=byId[id]||groups.find(x=>x.node_id===id);if(!onlyPinned)return true;
return g.members?g.members.some(m=>pinned.has(m)):pinned.has(id)}
function edges(){const sum={};D.links.forEach(l=>{const s=rep(l.source),t=rep(l.target);if(s===t)return;const k=s+'\\u0000'+t;
sum[k]=sum[k]||{source:s,target:t,weight:0};sum[k].weight+=l.weight});return Object.values(sum)}
function at(id){return byId[id]||groups.find(g=>g.node_id===id)}
function draw(){place();groups.forEach(g=>{const ms=g.members.map(m=>byId[m]);g.x=ms.reduce((a,m)=>a+m.x,0)/ms.length;g.y=ms.reduce((a,m)=>a+m.y,0)/ms.length});
svg.innerHTML='';D.metadata.prompt_tokens.forEach((t,i)=>{const e=document.createElementNS(NS,'text');e.setAttribute('x',cx(i,0.5));
e.setAttribute('y',(LAYERS-1)*RH+55);e.setAttribute('class','lbl');e.setAttribute('text-anchor','middle');e.textContent=t;svg.appendChild(e)});
edges().forEach(l=>{if(!shown(l.source)||!shown(l.target))return;const s=at(l.source),t=at(l.target);const e=document.createElementNS(NS,'line');
e.setAttribute('x1',s.x);e.setAttribute('y1',s.y);e.setAttribute('x2',t.x);e.setAttribute('y2',t.y);
e.setAttribute('data-source',l.source);e.setAttribute('data-target',l.target);e.setAttribute('data-weight',l.weight);
const a=Math.min(1,Math.abs(l.weight)/wmax);e.setAttribute('stroke',l.weight>0?'#36c':'#c33');e.setAttribute('stroke-opacity',0.15+0.85*a);
e.setAttribute('stroke-width',0.3+4*a);svg.appendChild(e)});
D.nodes.forEach(n=>{if(groupOf(n.node_id)||!shown(n.node_id))return;const c=document.createElementNS(NS,'circle');c.setAttribute('cx',n.x);c.setAttribute('cy',n.y);
c.setAttribute('r',n===selected?8:5);c.setAttribute('data-id',n.node_id);
c.setAttribute('fill',{embedding:'#9c9',logit:'#c9c','mlp reconstruction error':'#bbb'}[n.feature_type]||'#9bd');
c.setAttribute('class',(pinned.has(n.node_id)?'pinned ':'')+(chosen.has(n.node_id)?'chosen':''));c.onclick=ev=>click(n,ev);svg.appendChild(c)});
groups.forEach(g=>{if(!shown(g.node_id))return;const w=Math.min((W-2*M)/NT,60),r=document.createElementNS(NS,'rect');
r.setAttribute('x',Math.max(M/2,Math.min(W-M/2-w,g.x-w/2)));r.setAttribute('y',g.y-9);r.setAttribute('width',w);r.setAttribute('height',18);
r.setAttribute('class','super'+(g===selected?' chosen':''));r.setAttribute('data-id',g.node_id);r.onclick=ev=>click(g,ev);svg.appendChild(r);
const t=document.createElementNS(NS,'text');t.setAttribute('x',g.x);t.setAttribute('y',g.y+4);t.setAttribute('text-anchor','middle');
t.setAttribute('class','lbl');t.setAttribute('pointer-events','none');t.textContent=g.label;svg.appendChild(t)})}
function click(n,ev){if(ev&&ev.shiftKey&&!n.members){chosen.has(n.node_id)?chosen.delete(n.node_id):chosen.add(n.node_id);draw();return}select(n)}
function select(n){selected=n;const E=edges();const ins=E.filter(l=>l.target===n.node_id).sort((a,b)=>Math.abs(b.weight)-Math.abs(a.weight)).slice(0,8);
const outs=E.filter(l=>l.source===n.node_id).sort((a,b)=>Math.abs(b.weight)-Math.abs(a.weight)).slice(0,8);
const li=(l,k)=>'<li>'+esc(name(at(l[k])))+': '+l.weight.toPrecision(3)+'</li>';
document.getElementById('info').innerHTML='<b>'+esc(name(n))+'</b><br>'+(n.members?'members: '+n.members.map(m=>esc(name(byId[m]))).join('; '):
'activation: '+(n.activation==null?'-':n.activation.toPrecision(4))+'<br>influence (cumulative): '+(n.influence==null?'-':n.influence.toPrecision(3)))+
'<h4>strongest inputs</h4><ul>'+ins.map(l=>li(l,'source')).join('')+'</ul><h4>strongest outputs</h4><ul>'+outs.map(l=>li(l,'target')).join('')+'</ul>';
showDetails(n);draw()}
function showDetails(n){const el=document.getElementById('details');const p=n.node_id.split('_');const d=n.feature_type==='cross layer transcoder'?DET[p[0]+'_'+p[1]]:null;
if(!d){el.innerHTML=n.feature_type==='cross layer transcoder'?'<p>no feature details in this page</p>':'';return}
const top=d.max_act>0?d.max_act:1;const ctx=d.contexts.map(c=>'<div class="ctx" data-row="'+c.row+'" data-pos="'+c.pos+'" data-act="'+c.act+'"><span class="v">'+
c.act.toFixed(3)+'</span>'+c.tokens.map((t,i)=>'<span class="tok'+(c.start+i===c.pos?' top':'')+'" data-act="'+c.acts[i]+'" title="'+c.acts[i].toPrecision(4)+
'" style="background:rgba(255,120,0,'+Math.max(0,Math.min(1,c.acts[i]/top)).toFixed(3)+')">'+esc(t.replace(/\\n/g,'\\u21b5'))+'</span>').join('')+'</div>').join('');
const lg=(xs,cls)=>'<ul class="'+cls+'">'+xs.map(x=>'<li data-token="'+esc(x[0])+'" data-value="'+x[1]+'">'+esc(JSON.stringify(x[0]))+': '+x[1].toPrecision(4)+'</li>').join('')+'</ul>';
el.innerHTML='<h4>top-activating contexts ('+esc(D.feature_text||'')+')</h4><p>active on '+(100*d.frequency).toFixed(2)+'% of positions; max '+
d.max_act.toPrecision(4)+'</p><div class="contexts">'+(ctx||'<p>never active on this text</p>')+'</div><h4>logit effects (direct path)</h4><p class="lbl">of '+esc(d.decoder||'its decoder')+'</p><p>raises</p>'+
lg(d.top_logits,'up')+'<p>lowers</p>'+lg(d.bottom_logits,'down')}
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]))}
document.getElementById('pin').onclick=()=>{if(selected&&!selected.members){pinned.has(selected.node_id)?pinned.delete(selected.node_id):pinned.add(selected.node_id);draw()}};
document.getElementById('only').onclick=()=>{onlyPinned=true;draw()};document.getElementById('all').onclick=()=>{onlyPinned=false;draw()};
document.getElementById('group').onclick=()=>{if(chosen.size<2)return;const members=[...chosen].filter(m=>!groupOf(m));if(members.length<2)return;
const label=document.getElementById('label').value||('supernode '+(nGroups+1));groups.push({node_id:'super_'+(nGroups++),label:label,members:members});chosen.clear();draw()};
document.getElementById('ungroup').onclick=()=>{if(selected&&selected.members){groups=groups.filter(g=>g!==selected);selected=null;draw()}};
window.addEventListener('resize',draw);draw();
</script></body></html>"""


def graph_page(data: dict, n_layers: int, title: str = "attribution graph", details: Optional[dict] = None,
               details_text: str = "") -> str:
    """The page of ``frontend_json``'s ``data``; ``details`` (``details.feature_details``) and a few words on
    the text they were computed on (``details_text``) are shown when a feature is clicked."""
    extra = {"feature_details": details, "feature_text": details_text} if details is not None else {}
    payload = json.dumps({**data, "n_layers": n_layers, **extra}, allow_nan=False).replace("</", "<\\/")
    return TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__DATA__", payload)

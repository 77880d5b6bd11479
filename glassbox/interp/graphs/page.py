"""An offline page for an attribution graph: one HTML file, no script or style from the network.

Nodes are placed by layer (rows: embeddings at the bottom, then layer 0, 1, ..., the logits at the top)
and position (columns); edges are drawn with width by |weight| (blue positive, red negative). Clicking a
node shows what it is, its activation and influence, and its strongest inputs and outputs; "pin" adds it
to a subgraph and "show pinned" draws only the pinned nodes and the edges among them. The data is the
pruned graph (``frontend_json``'s), embedded as JSON in a ``<script type="application/json">`` element
(with ``</`` escaped, so token text cannot end the script).
"""

import html
import json

TEMPLATE = """<!doctype html><html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>body{font:13px sans-serif;margin:0;display:flex}#g{flex:1}#side{width:320px;padding:8px;border-left:1px solid #ccc;
overflow:auto;height:100vh;box-sizing:border-box}circle{cursor:pointer;stroke:#333}circle.pinned{stroke:#e80;stroke-width:3}
.lbl{font-size:10px;fill:#555}</style></head><body><svg id="g"></svg><div id="side"><h3>__TITLE__</h3>
<p id="prompt"></p><button id="pin">pin</button> <button id="only">show pinned</button> <button id="all">show all</button>
<div id="info">Click a node.</div></div>
<script type="application/json" id="data">__DATA__</script>
<script>
const D=JSON.parse(document.getElementById('data').textContent);const svg=document.getElementById('g');
const NS='http://www.w3.org/2000/svg';const W=Math.max(600,90*D.metadata.prompt_tokens.length),LAYERS=D.n_layers+2,RH=70;
svg.setAttribute('width',W);svg.setAttribute('height',LAYERS*RH+40);document.getElementById('prompt').textContent=D.metadata.prompt;
function row(n){return n.layer==='E'?0:(+n.layer)+1}
const byId={};const slots={};D.nodes.forEach(n=>{byId[n.node_id]=n;const k=row(n)+':'+n.ctx_idx;slots[k]=(slots[k]||0)+1;n.slot=slots[k]-1});
D.nodes.forEach(n=>{const k=row(n)+':'+n.ctx_idx;const m=slots[k];const cw=W/D.metadata.prompt_tokens.length;
n.x=cw*n.ctx_idx+cw*(n.slot+1)/(m+1);n.y=(LAYERS-row(n))*RH});
let pinned=new Set(),selected=null,onlyPinned=false;const wmax=Math.max(...D.links.map(l=>Math.abs(l.weight)),1e-12);
function name(n){if(n.feature_type==='embedding')return 'token '+JSON.stringify(D.metadata.prompt_tokens[n.ctx_idx])+' @'+n.ctx_idx;
if(n.feature_type==='logit')return n.clerp;if(n.feature_type==='mlp reconstruction error')return 'error L'+n.layer+' @'+n.ctx_idx;
return 'feature '+n.node_id.split('_')[1]+' L'+n.layer+' @'+n.ctx_idx}
function draw(){svg.innerHTML='';const show=n=>!onlyPinned||pinned.has(n.node_id);
D.metadata.prompt_tokens.forEach((t,i)=>{const e=document.createElementNS(NS,'text');e.setAttribute('x',W/D.metadata.prompt_tokens.length*(i+0.5));
e.setAttribute('y',LAYERS*RH+30);e.setAttribute('class','lbl');e.setAttribute('text-anchor','middle');e.textContent=t;svg.appendChild(e)});
D.links.forEach(l=>{const s=byId[l.source],t=byId[l.target];if(!s||!t||!show(s)||!show(t))return;const e=document.createElementNS(NS,'line');
e.setAttribute('x1',s.x);e.setAttribute('y1',s.y);e.setAttribute('x2',t.x);e.setAttribute('y2',t.y);
e.setAttribute('stroke',l.weight>0?'#36c':'#c33');e.setAttribute('stroke-opacity',0.15+0.85*Math.abs(l.weight)/wmax);
e.setAttribute('stroke-width',0.3+4*Math.abs(l.weight)/wmax);svg.appendChild(e)});
D.nodes.forEach(n=>{if(!show(n))return;const c=document.createElementNS(NS,'circle');c.setAttribute('cx',n.x);c.setAttribute('cy',n.y);
c.setAttribute('r',n===selected?8:5);c.setAttribute('data-id',n.node_id);
c.setAttribute('fill',{embedding:'#9c9',logit:'#c9c','mlp reconstruction error':'#bbb'}[n.feature_type]||'#9bd');
if(pinned.has(n.node_id))c.setAttribute('class','pinned');c.onclick=()=>select(n);svg.appendChild(c)})}
function select(n){selected=n;const ins=D.links.filter(l=>l.target===n.node_id).sort((a,b)=>Math.abs(b.weight)-Math.abs(a.weight)).slice(0,8);
const outs=D.links.filter(l=>l.source===n.node_id).sort((a,b)=>Math.abs(b.weight)-Math.abs(a.weight)).slice(0,8);
const li=(l,k)=>'<li>'+esc(name(byId[l[k]]))+': '+l.weight.toPrecision(3)+'</li>';
document.getElementById('info').innerHTML='<b>'+esc(name(n))+'</b><br>activation: '+(n.activation==null?'-':n.activation.toPrecision(4))+
'<br>influence (cumulative): '+(n.influence==null?'-':n.influence.toPrecision(3))+'<h4>strongest inputs</h4><ul>'+ins.map(l=>li(l,'source')).join('')+
'</ul><h4>strongest outputs</h4><ul>'+outs.map(l=>li(l,'target')).join('')+'</ul>';draw()}
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]))}
document.getElementById('pin').onclick=()=>{if(selected){pinned.has(selected.node_id)?pinned.delete(selected.node_id):pinned.add(selected.node_id);draw()}};
document.getElementById('only').onclick=()=>{onlyPinned=true;draw()};document.getElementById('all').onclick=()=>{onlyPinned=false;draw()};
draw();
</script></body></html>"""


def graph_page(data: dict, n_layers: int, title: str = "attribution graph") -> str:
    payload = json.dumps({**data, "n_layers": n_layers}, allow_nan=False).replace("</", "<\\/")
    return TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__DATA__", payload)

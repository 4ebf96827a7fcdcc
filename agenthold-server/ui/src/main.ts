// Entry of the agenthold web UI.
import { mount } from 'svelte';
import './app.css';
import App from './App.svelte';
import { startRouter } from './lib/router.svelte';

startRouter();
const target = document.getElementById('app');
if (target) mount(App, { target });
